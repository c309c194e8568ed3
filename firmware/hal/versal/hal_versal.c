/* The HAL of the Versal processing-system build (VCK190, VEK280): the Cortex-R5F of the RPU runs the firmware;
 * the link is the PS UART0 (an Arm PL011), the tile stream an AXI DMA in the PL (AMD PG021, simple mode)
 * between the RPU's memory and the tile's AXI4-Stream ports, time the R5's PMU cycle counter.
 *
 * Addresses come from somatile_versal.h, generated from the declaration the block design assigns them from
 * (boards/vivado.py ADDRESS_MAP; docs/aie.md): VERSAL_UART_BASE, VERSAL_DMA_BASE, and the on-chip memory the
 * DMA reaches, VERSAL_DMA_BUFFER_BASE. The DMA's length registers must hold a whole frame (checked below
 * against VERSAL_DMA_LENGTH_BITS, the block design's c_sg_length_width). The R5 runs with its caches off (its
 * reset state; nothing here enables them), so the DMA's bounce buffers in the on-chip memory (section .dma,
 * reachable from the PL at the same address) need no cache maintenance.
 * FW_CPU_HZ is the R5 clock the build was made for. */
#include <string.h>

#include "hal.h"

#include "fw.h"
#include "hal_uart.h"
#include "hal_versal.h"

#ifndef FW_CPU_HZ
#error "FW_CPU_HZ (the Cortex-R5F clock in Hz) must be defined by the build"
#endif

/* A frame longer than the DMA's length registers hold would be cut short without an error. */
typedef char dma_length_holds_a_frame[(FW_FRAME_BYTES < (1ul << VERSAL_DMA_LENGTH_BITS)) ? 1 : -1];

#define REG(address) (*(volatile uint32_t *)(uintptr_t)(address))

/* PL011 registers (Arm DDI 0183) */
#define UART_DR (VERSAL_UART_BASE + 0x00u)
#define UART_FR (VERSAL_UART_BASE + 0x18u)
#define UART_FR_RXFE (1u << 4)
#define UART_FR_TXFF (1u << 5)

/* AXI DMA registers, simple mode (PG021): MM2S memory -> tile input stream, S2MM tile output -> memory */
#define DMA_MM2S_CR (VERSAL_DMA_BASE + 0x00u)
#define DMA_MM2S_SR (VERSAL_DMA_BASE + 0x04u)
#define DMA_MM2S_SA (VERSAL_DMA_BASE + 0x18u)
#define DMA_MM2S_SA_MSB (VERSAL_DMA_BASE + 0x1Cu)
#define DMA_MM2S_LENGTH (VERSAL_DMA_BASE + 0x28u)
#define DMA_S2MM_CR (VERSAL_DMA_BASE + 0x30u)
#define DMA_S2MM_SR (VERSAL_DMA_BASE + 0x34u)
#define DMA_S2MM_DA (VERSAL_DMA_BASE + 0x48u)
#define DMA_S2MM_DA_MSB (VERSAL_DMA_BASE + 0x4Cu)
#define DMA_S2MM_LENGTH (VERSAL_DMA_BASE + 0x58u)
#define DMA_CR_RUN (1u << 0)
#define DMA_CR_RESET (1u << 2)
#define DMA_SR_IDLE (1u << 1)
#define DMA_SR_ERRORS (7u << 4) /* DMAIntErr, DMASlvErr, DMADecErr */
#define DMA_SR_IOC (1u << 12)

static uint8_t tx_bounce[FW_FRAME_BYTES] __attribute__((section(".dma"), aligned(64)));
static uint8_t rx_bounce[FW_FRAME_BYTES] __attribute__((section(".dma"), aligned(64)));

static uint32_t read_cycle_counter(void)
{
    uint32_t v;
    __asm__ volatile("mrc p15, 0, %0, c9, c13, 0" : "=r"(v)); /* PMCCNTR */
    return v;
}

/* The 32-bit counter wraps every few seconds; every wait polls it far more often than that. */
static uint64_t now_cycles(void)
{
    static uint32_t last;
    static uint64_t high;
    uint32_t now = read_cycle_counter();
    if (now < last)
        high += (uint64_t)1 << 32;
    last = now;
    return high | now;
}

static uint64_t deadline_after(uint32_t timeout_ms)
{
    return now_cycles() + (uint64_t)timeout_ms * (FW_CPU_HZ / 1000u);
}

void hal_versal_init(void)
{
    uint32_t pmcr;
    __asm__ volatile("mrc p15, 0, %0, c9, c12, 0" : "=r"(pmcr));
    pmcr |= 1u | 4u; /* E: counters on; C: cycle counter reset */
    __asm__ volatile("mcr p15, 0, %0, c9, c12, 0" ::"r"(pmcr));
    __asm__ volatile("mcr p15, 0, %0, c9, c12, 1" ::"r"(1u << 31)); /* PMCNTENSET: the cycle counter */
    REG(DMA_MM2S_CR) = DMA_CR_RESET; /* resets both channels */
    while (REG(DMA_MM2S_CR) & DMA_CR_RESET)
        ;
    REG(DMA_MM2S_CR) = DMA_CR_RUN;
    REG(DMA_S2MM_CR) = DMA_CR_RUN;
}

static int take_byte(void)
{
    return (REG(UART_FR) & UART_FR_RXFE) ? -1 : (int)(REG(UART_DR) & 0xFFu);
}

int hal_link_read(uint8_t *buf, size_t cap, uint32_t timeout_ms)
{
    return hal_uart_read(buf, cap, deadline_after(timeout_ms), take_byte, now_cycles);
}

int hal_link_write(const uint8_t *buf, size_t n)
{
    size_t i;
    /* A UART cannot tell whether anybody listens: the write always succeeds. */
    for (i = 0; i < n; i++) {
        while (REG(UART_FR) & UART_FR_TXFF)
            ;
        REG(UART_DR) = buf[i];
    }
    return 0;
}

/* Wait until a channel is idle; 0, -1 on the deadline, -2 on a DMA error (the status bits are left set). */
static int wait_idle(uint32_t status_reg, uint64_t deadline)
{
    for (;;) {
        uint32_t sr = REG(status_reg);
        if (sr & DMA_SR_ERRORS)
            return -2;
        if (sr & DMA_SR_IDLE) {
            REG(status_reg) = DMA_SR_IOC;
            return 0;
        }
        if (now_cycles() >= deadline)
            return -1;
    }
}

/* An answer whose pop timed out is still owed: its S2MM transfer stays armed, so a late answer lands in the
 * bounce buffer and is dropped before the next command, never taken for that command's answer. */
static int answer_owed;

static void reset_dma(void)
{
    hal_versal_init();
    answer_owed = 0;
}

static int settle_owed(uint64_t deadline)
{
    int r;
    if (!answer_owed)
        return 0;
    r = wait_idle(DMA_S2MM_SR, deadline);
    if (r == -1)
        return -1;
    if (r == -2)
        reset_dma();
    answer_owed = 0;
    return 0;
}

int hal_stream_push(unsigned tile, const uint8_t *frame, size_t n)
{
    uint64_t deadline = deadline_after(FW_TILE_TIMEOUT_MS);

    (void)tile; /* one stream pair reaches the whole array; it routes frames by their head byte */
    if (n == 0 || n % 4 != 0 || n > sizeof tx_bounce || settle_owed(deadline) < 0)
        return -1;
    memcpy(tx_bounce, frame, n);
    REG(DMA_MM2S_SA) = (uint32_t)(uintptr_t)tx_bounce;
    REG(DMA_MM2S_SA_MSB) = 0;
    REG(DMA_MM2S_LENGTH) = (uint32_t)n; /* starts the transfer; tlast goes with its last beat */
    if (wait_idle(DMA_MM2S_SR, deadline) == -2) {
        reset_dma();
        return -1;
    }
    return 0;
}

int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got)
{
    uint64_t deadline = deadline_after(timeout_ms);
    size_t received;
    int r;

    (void)tile;
    *got = 0;
    if (!answer_owed) {
        REG(DMA_S2MM_DA) = (uint32_t)(uintptr_t)rx_bounce;
        REG(DMA_S2MM_DA_MSB) = 0;
        REG(DMA_S2MM_LENGTH) = (uint32_t)sizeof rx_bounce; /* a frame ends at tlast, however long it is */
    }
    answer_owed = 0;
    r = wait_idle(DMA_S2MM_SR, deadline);
    if (r == -1) {
        answer_owed = 1;
        return HAL_POP_TIMEOUT;
    }
    if (r == -2) { /* longer than any frame: the DMA stopped mid-frame */
        reset_dma();
        return HAL_POP_OVERFLOW;
    }
    received = REG(DMA_S2MM_LENGTH); /* bytes written up to tlast */
    *got = received < cap ? received : cap;
    memcpy(buf, rx_bounce, *got);
    return received > cap ? HAL_POP_OVERFLOW : HAL_POP_OK;
}
