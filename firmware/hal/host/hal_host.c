/* The HAL of the host build: the link is a file descriptor (a TCP connection, a pty master, or stdin and
 * stdout), and each tile's stream is a TCP connection to a tile server (the golden tile model,
 * somatile.host.emu, or the RTL in Verilator, somatile.sim.serve_tile) that speaks the tile-bus framing:
 *
 *   request  u8 kind (1 = command frame), u8 tile, u16 0, u32 length, then the frame's bytes (tlast after
 *            the last byte)
 *   answer   u32 length, then the answer frame's bytes (tlast after the last byte)
 */
#define _XOPEN_SOURCE 600
#include "hal_host.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fw.h"
#include "hal.h"

static int link_in = -1, link_out = -1;
static int link_is_pty;
static int tile_fd = -1;

void hal_host_set_link(int in_fd, int out_fd, int is_pty)
{
    link_in = in_fd;
    link_out = out_fd;
    link_is_pty = is_pty;
}

void hal_host_set_tiles(int fd)
{
    tile_fd = fd;
}

static void sleep_ms(long ms)
{
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&t, NULL);
}

int hal_link_read(uint8_t *buf, size_t cap, uint32_t timeout_ms)
{
    struct pollfd pfd;
    ssize_t n;
    int r;

    pfd.fd = link_in;
    pfd.events = POLLIN;
    pfd.revents = 0;
    do {
        r = poll(&pfd, 1, (int)timeout_ms);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return -1;
    if (r == 0)
        return 0;
    n = read(link_in, buf, cap);
    if (n > 0)
        return (int)n;
    if (link_is_pty && (n == 0 || errno == EIO)) {
        /* No process has the pty's other end open (yet or any more): wait like an idle UART. */
        sleep_ms(timeout_ms < 50 ? (long)timeout_ms : 50);
        return 0;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    return -1;
}

static int write_all(int fd, const uint8_t *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

int hal_link_write(const uint8_t *buf, size_t n)
{
    /* A pty with nobody at the other end would block or fail; the answer is dropped like on a UART. */
    if (write_all(link_out, buf, n) < 0)
        return link_is_pty ? 0 : -1;
    return 0;
}

int hal_stream_push(unsigned tile, const uint8_t *frame, size_t n)
{
    uint8_t head[8];
    head[0] = 1;
    head[1] = (uint8_t)tile;
    head[2] = head[3] = 0;
    fw_put_u32(head + 4, (uint32_t)n);
    if (tile_fd < 0 || write_all(tile_fd, head, sizeof head) < 0 || write_all(tile_fd, frame, n) < 0)
        return -1;
    return 0;
}

/* Read exactly n bytes (into buf, or dropped when buf is NULL) before the deadline. */
static int read_before(uint8_t *buf, size_t n, struct timespec deadline, size_t *got)
{
    uint8_t sink[256];
    while (n > 0) {
        struct timespec now;
        long left;
        struct pollfd pfd;
        ssize_t r;
        size_t want = buf ? n : (n < sizeof sink ? n : sizeof sink);

        clock_gettime(CLOCK_MONOTONIC, &now);
        left = (deadline.tv_sec - now.tv_sec) * 1000L + (deadline.tv_nsec - now.tv_nsec) / 1000000L;
        if (left <= 0)
            return -1;
        pfd.fd = tile_fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        if (poll(&pfd, 1, (int)left) <= 0)
            continue;
        r = read(tile_fd, buf ? buf : sink, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        if (buf)
            buf += r;
        n -= (size_t)r;
        if (got)
            *got += (size_t)r;
    }
    return 0;
}

int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got)
{
    uint8_t head[4];
    struct timespec deadline;
    uint32_t length;
    size_t header_got = 0;

    (void)tile; /* one connection carries every tile; answers come back in command order */
    *got = 0;
    if (tile_fd < 0)
        return HAL_POP_TIMEOUT;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000u;
    deadline.tv_nsec += (long)(timeout_ms % 1000u) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    if (read_before(head, sizeof head, deadline, &header_got) < 0)
        return HAL_POP_TIMEOUT;
    length = fw_get_u32(head);
    if (length > cap) {
        if (read_before(NULL, length, deadline, NULL) < 0)
            return HAL_POP_TIMEOUT;
        return HAL_POP_OVERFLOW;
    }
    if (read_before(buf, length, deadline, got) < 0)
        return HAL_POP_TIMEOUT;
    return HAL_POP_OK;
}
