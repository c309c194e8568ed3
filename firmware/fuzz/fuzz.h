/* What the fuzz builds share: the target (fuzz_frame.c), the CRC re-sealing of the mutators, and the hook
 * through which a fuzz HAL sees each input before the firmware does. */
#ifndef SOMATILE_FUZZ_H
#define SOMATILE_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t fuzz_reseal(uint8_t *data, size_t size);
/* Called with every input before it is fed: a HAL may derive its tile's behaviour from it. */
void fuzz_hal_begin(const uint8_t *data, size_t size);

#endif
