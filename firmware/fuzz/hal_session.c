/* HAL of the session library (libfw_session.so): the firmware as a function from link bytes to link bytes,
 * for differential fuzzing against the Python reference firmware (tests/host/test_fuzz_protocol.py).
 *
 *   size_t fw_session(const uint8_t *input, size_t n, uint8_t *output, size_t cap, fw_tile_port port)
 *
 * runs a freshly initialised firmware on input (the fuzz input convention of fuzz_frame.c: 00 FF 00 is an
 * inter-byte timeout) and returns the number of answer bytes, all of them written to output when they fit
 * (a larger return value than cap means output holds only the first cap bytes). Each tile command goes to
 * port, the caller's tile (the golden tile model), at push time; its answer is popped like a stream. */
#include <string.h>

#include "fuzz.h"
#include "fw.h"
#include "hal.h"

/* The caller's tile: answer the command frame into answer (at most cap bytes), its length in *answer_len;
 * return 0, or < 0 when the answer did not fit. */
typedef int (*fw_tile_port)(unsigned tile, const uint8_t *command, size_t n, uint8_t *answer, size_t cap,
                            size_t *answer_len);

size_t fw_session(const uint8_t *input, size_t n, uint8_t *output, size_t cap, fw_tile_port port);

static fw_tile_port tile_port;
static uint8_t *out_buf;
static size_t out_cap, out_len;
static uint8_t pending[FW_FRAME_BYTES];
static size_t pending_len;
static int pending_overflow;

/* The tile is the caller's: its faults are whatever the caller's tile does. */
void fuzz_hal_begin(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
}

int hal_link_write(const uint8_t *buf, size_t n)
{
    if (out_len < out_cap)
        memcpy(out_buf + out_len, buf, n < out_cap - out_len ? n : out_cap - out_len);
    out_len += n;
    return 0;
}

int hal_stream_push(unsigned tile, const uint8_t *frame, size_t n)
{
    pending_overflow = tile_port(tile, frame, n, pending, sizeof pending, &pending_len) < 0;
    return 0;
}

int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got)
{
    (void)tile;
    (void)timeout_ms;
    *got = 0;
    if (pending_overflow || pending_len > cap)
        return HAL_POP_OVERFLOW; /* drained and dropped, as the host HAL does */
    memcpy(buf, pending, pending_len);
    *got = pending_len;
    return HAL_POP_OK;
}

size_t fw_session(const uint8_t *input, size_t n, uint8_t *output, size_t cap, fw_tile_port port)
{
    tile_port = port;
    out_buf = output;
    out_cap = cap;
    out_len = 0;
    pending_len = 0;
    pending_overflow = 0;
    LLVMFuzzerTestOneInput(input, n);
    return out_len;
}
