/* What the Versal processing-system main needs of its HAL beside include/hal.h. */
#ifndef SOMATILE_HAL_VERSAL_H
#define SOMATILE_HAL_VERSAL_H

/* The addresses the block design assigns (generated from boards/vivado.py ADDRESS_MAP). */
#include "somatile_versal.h"

/* The R5's cycle counter on and the AXI DMA reset and running; called once before fw_init. */
void hal_versal_init(void);

#endif
