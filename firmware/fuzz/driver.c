/* A bounded mutation fuzzer for compilers without libFuzzer (gcc): starts from valid frames of every
 * opcode, mutates them (bit flips, byte sets, insertions, deletions, splices, length-field edits,
 * truncation markers; half the inputs then re-sealed with valid CRCs) and feeds each input to
 * LLVMFuzzerTestOneInput. Deterministic for a given seed.
 * --write-seeds DIR writes unmutated sessions as files instead: the seed corpus of the libFuzzer build, which
 * would otherwise spend its run rediscovering the magic, the header layout and the CRC.
 *
 *   fuzz_frame [--iterations N] [--seed S] [--write-seeds DIR]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fw.h"

extern unsigned long fuzz_answers, fuzz_tile_commands;

#define MAX_INPUT 4096u

static uint64_t rng_state;

static uint32_t next(void)
{
    /* xorshift64*: enough for mutation choices, and reproducible. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}

static size_t make_frame(uint8_t *out, uint8_t opcode, uint16_t seq, const uint8_t *payload, uint32_t length)
{
    memcpy(out + WIRE_HEADER_SIZE, payload, length);
    return fw_frame_seal(out, opcode, seq, length);
}

/* A valid session: HELLO then a few requests of each kind with consecutive sequence numbers. */
static size_t seed_input(uint8_t *out)
{
    uint8_t payload[256];
    size_t n = 0;
    uint16_t seq = 7;
    unsigned k;

    memset(payload, 0, sizeof payload);
    n += make_frame(out + n, WIRE_OP_HELLO, seq++, payload, 0);
    for (k = 0; k < 3; k++) {
        uint32_t len = WIRE_TILE_PREFIX_SIZE + SOMATILE_HEADER_BYTES + 16u * (next() % 4);
        unsigned i;
        for (i = 0; i < len; i++)
            payload[i] = (uint8_t)next();
        fw_put_u32(payload, next() % (SOMATILE_N_TILES + 1));
        payload[WIRE_TILE_PREFIX_SIZE] = SOMATILE_FRAME_MAGIC;
        n += make_frame(out + n, WIRE_OP_TILE, seq++, payload, len);
    }
    fw_put_u32(payload, next() % (SOMATILE_HEADS * SOMATILE_N_TILES + 1));
    n += make_frame(out + n, WIRE_OP_CONFIGURE, seq++, payload, 4u + 4u * SOMATILE_HEAD_PARAM_COUNT);
    n += make_frame(out + n, WIRE_OP_RESET, seq, payload, 0);
    n += make_frame(out + n, WIRE_OP_RESET, seq, payload, 0); /* a retry */
    return n;
}

static size_t mutate(uint8_t *buf, size_t n)
{
    unsigned rounds = 1 + next() % 8, r;
    for (r = 0; r < rounds; r++) {
        size_t at = n ? next() % n : 0;
        switch (next() % 7) {
        case 0:
            if (n)
                buf[at] ^= (uint8_t)(1u << (next() % 8));
            break;
        case 1:
            if (n)
                buf[at] = (uint8_t)next();
            break;
        case 2: /* insert a byte */
            if (n < MAX_INPUT) {
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = (uint8_t)next();
                n++;
            }
            break;
        case 3: /* delete a run */
            if (n) {
                size_t len = 1 + next() % 16;
                if (len > n - at)
                    len = n - at;
                memmove(buf + at, buf + at + len, n - at - len);
                n -= len;
            }
            break;
        case 4: /* a large or boundary length field somewhere */
            if (n >= 4) {
                static const uint32_t lengths[] = {0, 1, FW_MAX_PAYLOAD, FW_MAX_PAYLOAD + 1u, 0xFFFFFFFFu, 20};
                fw_put_u32(buf + (at > n - 4 ? n - 4 : at), lengths[next() % 6]);
            }
            break;
        case 5: /* a truncation marker */
            if (n + 3 <= MAX_INPUT) {
                memmove(buf + at + 3, buf + at, n - at);
                buf[at] = 0x00;
                buf[at + 1] = 0xFF;
                buf[at + 2] = 0x00;
                n += 3;
            }
            break;
        default: /* cut the input short */
            n = at;
            break;
        }
    }
    if (next() & 1u) /* half the inputs get past the CRC check with their mutations (fuzz_frame.c) */
        fuzz_reseal(buf, n);
    return n;
}

#define SEED_FILES 16u

static int write_seeds(const char *dir)
{
    static uint8_t session[MAX_INPUT];
    char path[4096];
    unsigned k;

    for (k = 0; k < SEED_FILES; k++) {
        size_t n = seed_input(session);
        FILE *f;
        if ((size_t)snprintf(path, sizeof path, "%s/seed-%02u", dir, k) >= sizeof path) {
            fprintf(stderr, "fuzz_frame: --write-seeds directory name too long: %s\n", dir);
            return 1;
        }
        f = fopen(path, "wb");
        if (f == NULL || fwrite(session, 1, n, f) != n || fclose(f) != 0) {
            perror(path);
            return 1;
        }
    }
    printf("fuzz_frame: %u seed sessions in %s\n", SEED_FILES, dir);
    return 0;
}

int main(int argc, char **argv)
{
    static uint8_t base[MAX_INPUT], input[MAX_INPUT];
    unsigned long iterations = 20000, i;
    unsigned long long seed = 1;
    const char *seed_dir = NULL;
    int a;

    for (a = 1; a < argc; a += 2) {
        if (a + 1 == argc) {
            fprintf(stderr, "fuzz_frame: %s needs a value\n", argv[a]);
            return 2;
        }
        if (strcmp(argv[a], "--iterations") == 0)
            iterations = strtoul(argv[a + 1], NULL, 10);
        else if (strcmp(argv[a], "--seed") == 0)
            seed = strtoull(argv[a + 1], NULL, 10);
        else if (strcmp(argv[a], "--write-seeds") == 0)
            seed_dir = argv[a + 1];
        else {
            fprintf(stderr, "fuzz_frame: unknown option %s (expected --iterations N, --seed S, --write-seeds DIR)\n",
                    argv[a]);
            return 2;
        }
    }
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    if (seed_dir != NULL)
        return write_seeds(seed_dir);
    for (i = 0; i < iterations; i++) {
        size_t n = seed_input(base);
        memcpy(input, base, n);
        n = mutate(input, n);
        LLVMFuzzerTestOneInput(input, n);
    }
    printf("fuzz_frame: %lu inputs, seed %llu, no crash; %lu answers, %lu tile commands\n", iterations, seed,
           fuzz_answers, fuzz_tile_commands);
    return 0;
}
