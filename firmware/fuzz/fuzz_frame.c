/* Fuzz target: arbitrary link bytes into the firmware. A 0x00 0xFF 0x00 sequence in the input stands for
 * "the inter-byte timeout passed here", so the fuzzer also explores truncation. Works as a libFuzzer target
 * (clang -fsanitize=fuzzer), with the bounded mutation driver of driver.c (gcc) and in the session library
 * (hal_session.c) the Python reference is compared with. */
#include <stddef.h>
#include <stdint.h>

#include "fw.h"
#include "hal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
