/* Fuzz target: arbitrary link bytes into the firmware. A 0x00 0xFF 0x00 sequence in the input stands for
 * "the inter-byte timeout passed here", so the fuzzer also explores truncation. Works as a libFuzzer target
 * (clang -fsanitize=fuzzer) and with the bounded mutation driver of driver.c (gcc). */
#include <stddef.h>
#include <stdint.h>

#include "fw.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
