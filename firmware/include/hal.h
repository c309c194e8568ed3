/* The hardware-abstraction layer the firmware needs from a board (or from the host build, hal/host/).
 *
 * Link: the byte stream to the host (UART, USB CDC, a TCP socket, a pty).
 * Stream: the tile's AXI4-Stream ports. A command frame is pushed as little-endian beats, tlast on its last
 * beat; the answer frame is popped up to its tlast beat. Frames are a whole number of beats
 * (SOMATILE_FRAME_GRANULE bytes) by construction of the command layer.
 */
#ifndef SOMATILE_HAL_H
#define SOMATILE_HAL_H

#include <stddef.h>
#include <stdint.h>

/* Up to cap bytes from the link: > 0 bytes read, 0 when nothing came within timeout_ms, < 0 link closed. */
int hal_link_read(uint8_t *buf, size_t cap, uint32_t timeout_ms);
/* Send all n bytes: 0, or < 0 when the link is closed. */
int hal_link_write(const uint8_t *buf, size_t n);

/* Push one whole command frame to a tile's input stream (tlast on the last beat): 0, or < 0 on failure. */
int hal_stream_push(unsigned tile, const uint8_t *frame, size_t n);

enum hal_pop_result { HAL_POP_OK = 0, HAL_POP_TIMEOUT = -1, HAL_POP_OVERFLOW = -2 };
/* Pop one answer frame (up to tlast) into buf. *got is the number of bytes received, also on a timeout.
 * On overflow the rest of the frame is drained and dropped. */
int hal_stream_pop(unsigned tile, uint8_t *buf, size_t cap, uint32_t timeout_ms, size_t *got);

#endif
