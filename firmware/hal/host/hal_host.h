/* Set-up of the host build's HAL (hal_host.c): which descriptors carry the link and the tile bus. */
#ifndef SOMATILE_HAL_HOST_H
#define SOMATILE_HAL_HOST_H

void hal_host_set_link(int in_fd, int out_fd, int is_pty);
void hal_host_set_tiles(int fd);

#endif
