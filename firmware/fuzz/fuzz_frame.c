/* Fuzz target: arbitrary link bytes into the firmware. A 0x00 0xFF 0x00 sequence in the input stands for
 * "the inter-byte timeout passed here", so the fuzzer also explores truncation. Works as a libFuzzer target
 * (clang -fsanitize=fuzzer), with the bounded mutation driver of driver.c (gcc) and in the session library
 * (hal_session.c) the Python reference is compared with. */
#include <stddef.h>
#include <stdint.h>

#include "fuzz.h"
#include "fw.h"
#include "hal.h"

/* The target feeds the link itself (fw_feed, fw_expire), so the main loop's link read is never called; every
 * fuzz HAL shares this one. */
int hal_link_read(uint8_t *buf, size_t cap, uint32_t timeout_ms)
{
    (void)buf;
    (void)cap;
    (void)timeout_ms;
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fw_device dev;
    size_t start = 0, i;

    fuzz_hal_begin(data, size);
    fw_init(&dev);
    for (i = 0; i + 2 < size; i++) {
        if (data[i] == 0x00 && data[i + 1] == 0xFF && data[i + 2] == 0x00) {
            fw_feed(&dev, data + start, i - start);
            fw_expire(&dev);
            start = i + 3;
            i += 2;
        }
    }
    fw_feed(&dev, data + start, size - start);
    fw_expire(&dev);
    return 0;
}

/* Random mutations almost never leave a frame's CRC valid, so on their own they stop at the CRC check: after
 * 600,000 libFuzzer runs no mutated frame had reached the unknown-opcode, wrong-API-level or bad-length
 * answers. The mutators therefore re-seal some inputs: every complete frame found in data (a magic pair, a
 * length within FW_MAX_PAYLOAD and within the input) gets its correct CRC. Returns the number resealed. */
size_t fuzz_reseal(uint8_t *data, size_t size)
{
    size_t i = 0, resealed = 0;

    while (i + WIRE_HEADER_SIZE <= size) {
        uint32_t length = fw_get_u32(data + i + 6);
        if (data[i] != WIRE_MAGIC0 || data[i + 1] != WIRE_MAGIC1 || length > FW_MAX_PAYLOAD ||
            size - i - WIRE_HEADER_SIZE < (size_t)length + WIRE_CRC_SIZE) {
            i++;
            continue;
        }
        fw_put_u32(data + i + WIRE_HEADER_SIZE + length, fw_crc32(0, data + i, WIRE_HEADER_SIZE + length));
        i += WIRE_HEADER_SIZE + length + WIRE_CRC_SIZE;
        resealed++;
    }
    return resealed;
}
