/* libFuzzer's custom mutator (linked into fuzz_frame_libfuzzer only): its own mutations, then on every
 * other one the frames re-sealed with valid CRCs (fuzz_reseal in fuzz_frame.c), so mutated headers and
 * payloads get past the CRC check into the dispatch while damaged CRCs keep being explored. */
#include "fuzz.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    size = LLVMFuzzerMutate(data, size, max_size);
    if (seed & 1u)
        fuzz_reseal(data, size);
    return size;
}
