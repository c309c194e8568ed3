/* The tile's command layer in firmware, for an SoC whose peripheral is the HCCS unit alone (hw/soc.py,
 * peripheral hccs_unit; src/soft_tile.c). It answers the commands of SOC_SOFT_TILE_COMMANDS (INFO, REG_READ,
 * REG_WRITE, CONFIGURE_HEAD, HCCS, CLEAR_ERROR) with the bytes, error codes and check order of the golden
 * model (hw/tile_model.py TileModel, profile paper) and refuses the others (DECODE and the state commands:
 * there is no decode unit) as UNKNOWN_OPCODE; its commands INFO register says which it runs. The HCCS rows go
 * through the HAL's soft_tile_normalise (the unit's registers). */
#ifndef SOMATILE_SOFT_TILE_H
#define SOMATILE_SOFT_TILE_H

#include <stdint.h>

#include "somatile_regmap.h"

/* One head's HCCS parameters as the unit takes them (model.hccs codes for mode and out). */
struct soft_tile_hccs {
    uint32_t B, S, dmax, mode, out;
};

/* Bytes of the largest response: a header and the HCCS rows of the staging memory at two bytes per
 * probability (hccs_out int16), or the INFO words. */
#define SOFT_TILE_ANSWER_BYTES (SOMATILE_HEADER_BYTES + 2u * SOMATILE_STAGING_BYTES + 64u)

/* Power-on state: every head unconfigured with the default parameters, registers cleared. */
void soft_tile_reset(void);

/* Execute one command frame of n bytes; its response goes to answer (SOFT_TILE_ANSWER_BYTES). Returns the
 * response's length, or 0 when the HCCS unit did not answer in time (no response; the caller reports
 * TILE_TIMEOUT). */
uint32_t soft_tile_command(const uint8_t *frame, uint32_t n, uint8_t *answer);

/* HAL: normalise `rows` rows of n int8 logits, row r at x + r * stride, with head `head`'s parameters; the
 * probabilities (out_bytes each, little-endian) of row r go to out + r * stride * out_bytes. 0, or < 0 when
 * the unit did not answer in time. */
int soft_tile_normalise(uint8_t head, const struct soft_tile_hccs *params, const uint8_t *x, uint32_t rows,
                        uint32_t n, uint32_t stride, uint8_t *out, unsigned out_bytes);

/* HAL: a free-running clock cycle count (CYCLES_LAST is the difference over a command). */
uint32_t soft_tile_cycles(void);

#endif
