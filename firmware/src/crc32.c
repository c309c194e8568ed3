#include "fw.h"

/* CRC-32 of IEEE 802.3 (reflected polynomial 0xEDB88320), the same as zlib.crc32; the table is built on
 * first use so that it costs 1 KB of RAM and no flash constants. */
uint32_t fw_crc32(uint32_t crc, const uint8_t *data, size_t n)
{
    static uint32_t table[256];
    static int ready;
    size_t i;

    if (!ready) {
        uint32_t b, k;
        for (b = 0; b < 256; b++) {
            uint32_t c = b;
            for (k = 0; k < 8; k++)
                c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
            table[b] = c;
        }
        ready = 1;
    }
    crc = ~crc;
    for (i = 0; i < n; i++)
        crc = table[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}
