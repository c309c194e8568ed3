/* somatile-fw: the firmware's host build.
 *
 *   somatile-fw --tiles HOST:PORT (--listen HOST:PORT | --pty | --stdio)
 *
 * --tiles   the tile server (golden model or RTL simulation) behind the HAL's stream
 * --listen  serve the link on a TCP port (port 0 picks a free one); one host connection at a time, and a host
 *           idle for HOST_IDLE_TAKEOVER_MS gives the device up to one that is waiting (docs/firmware.md)
 * --pty     serve the link on a new pseudo-terminal (the host opens it as serial:///dev/pts/N)
 * --stdio   serve the link on stdin/stdout
 * With --listen and --pty the first line on stdout says where the link is ("listening HOST:PORT" or
 * "pty PATH"), for scripts.
 */
#define _XOPEN_SOURCE 600
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "fw.h"
#include "hal.h"
#include "hal_host.h"

/* The tiles' parameters and Soma state are one resource, so one host owns the device at a time (two hosts
 * interleaving decode steps would each get the other's state). An owner that has sent no complete frame for
 * this long while another host is waiting to connect loses the device to it; with nobody waiting it keeps
 * it. Long enough that a host pausing between requests (a loaded machine, a garbage collection) keeps the
 * device; short enough that a waiting host is served within the default 4 x 2 s of its HELLO's attempts. */
#define HOST_IDLE_TAKEOVER_MS 3000
/* A host that takes no answer bytes for this long (its receive window full) is dropped like a closed one. */
#define HOST_WRITE_TIMEOUT_MS 5000
/* Connections the kernel completes while one host is served; a full queue makes new connects wait. */
#define HOST_LISTEN_BACKLOG 64

static int usage(const char *why)
{
    fprintf(stderr, "somatile-fw: %s\nusage: somatile-fw --tiles HOST:PORT (--listen HOST:PORT | --pty | --stdio)\n",
            why);
    return 2;
}

static int parse_address(const char *text, struct sockaddr_in *addr)
{
    char host[64];
    const char *colon = strrchr(text, ':');
    char *end;
    long port;
    size_t n;

    if (!colon || (n = (size_t)(colon - text)) == 0 || n >= sizeof host)
        return -1;
    memcpy(host, text, n);
    host[n] = 0;
    port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return -1;
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, &addr->sin_addr) == 1 ? 0 : -1;
}

static void no_delay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int connect_tiles(const struct sockaddr_in *addr)
{
    int attempt;
    /* The tile server may still be starting (a Verilator build): retry for up to a minute. */
    for (attempt = 0; attempt < 600; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct timespec t = {0, 100000000L};
        if (fd < 0)
            return -1;
        if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0) {
            no_delay(fd);
            return fd;
        }
        close(fd);
        nanosleep(&t, NULL);
    }
    return -1;
}

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* Serve one connected host until it closes, a write to it fails, or it has been idle for
 * HOST_IDLE_TAKEOVER_MS while another host is waiting on the listening socket. */
static void serve_client(struct fw_device *dev, int server, int fd)
{
    static uint8_t chunk[4096];
    struct timeval send_timeout = {HOST_WRITE_TIMEOUT_MS / 1000, (HOST_WRITE_TIMEOUT_MS % 1000) * 1000};
    long last_frame = now_ms(), last_byte = last_frame;
    uint32_t frames = 0;

    no_delay(fd);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    hal_host_set_link(fd, fd, 0);
    fw_init(dev);
    for (;;) {
        struct pollfd pfd[2];
        long now;
        int r;

        pfd[0].fd = fd;
        pfd[1].fd = server;
        pfd[0].events = pfd[1].events = POLLIN;
        pfd[0].revents = pfd[1].revents = 0;
        r = poll(pfd, 2, WIRE_INTERBYTE_TIMEOUT_MS);
        if (r < 0 && errno != EINTR)
            return;
        now = now_ms();
        if (r > 0 && pfd[0].revents) {
            int n = hal_link_read(chunk, sizeof chunk, 0);
            if (n < 0)
                return;
            if (n > 0) {
                fw_feed(dev, chunk, (size_t)n);
                last_byte = now;
            }
        } else if (now - last_byte >= (long)WIRE_INTERBYTE_TIMEOUT_MS) {
            fw_expire(dev);
        }
        if (dev->link_failed)
            return;
        if (dev->frames != frames) {
            frames = dev->frames;
            last_frame = now;
        }
        if (r > 0 && (pfd[1].revents & POLLIN) && now - last_frame >= HOST_IDLE_TAKEOVER_MS)
            return;
    }
}

static int serve_tcp(struct fw_device *dev, struct sockaddr_in *addr)
{
    socklen_t len = sizeof *addr;
    int one = 1;
    int server = socket(AF_INET, SOCK_STREAM, 0);

    if (server < 0)
        return 1;
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(server, (struct sockaddr *)addr, sizeof *addr) < 0 || listen(server, HOST_LISTEN_BACKLOG) < 0 ||
        getsockname(server, (struct sockaddr *)addr, &len) < 0) {
        perror("somatile-fw: --listen");
        return 1;
    }
    printf("listening %s:%u\n", inet_ntoa(addr->sin_addr), (unsigned)ntohs(addr->sin_port));
    fflush(stdout);
    for (;;) {
        int fd = accept(server, NULL, NULL);
        if (fd < 0) {
            /* A host that reset its connection before it was accepted, or no descriptor free for the moment:
             * the next host must still be served. */
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK) {
                perror("somatile-fw: accept");
                return 1;
            }
            if (errno != EINTR && errno != ECONNABORTED) {
                struct timespec t = {0, 50000000L};
                nanosleep(&t, NULL);
            }
            continue;
        }
        serve_client(dev, server, fd);
        close(fd);
    }
}

static int serve_pty(struct fw_device *dev)
{
    struct termios raw;
    int master = posix_openpt(O_RDWR | O_NOCTTY);

    if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0) {
        perror("somatile-fw: --pty");
        return 1;
    }
    /* Raw bytes both ways, as on a UART: no echo, no line editing, no CR/LF translation. */
    if (tcgetattr(master, &raw) == 0) {
        cfmakeraw(&raw);
        tcsetattr(master, TCSANOW, &raw);
    }
    printf("pty %s\n", ptsname(master));
    fflush(stdout);
    hal_host_set_link(master, master, 1);
    fw_init(dev);
    return fw_run(dev) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    static struct fw_device dev;
    struct sockaddr_in tiles_addr, link_addr;
    const char *tiles = NULL, *listen_at = NULL;
    int mode = 0, i, fd;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tiles") == 0 && i + 1 < argc)
            tiles = argv[++i];
        else if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
            listen_at = argv[++i], mode = 'l';
        else if (strcmp(argv[i], "--pty") == 0)
            mode = 'p';
        else if (strcmp(argv[i], "--stdio") == 0)
            mode = 's';
        else
            return usage("unknown or incomplete argument");
    }
    /* A host that closes its end before reading its answers must cost only that host's connection: a write to
     * it fails with EPIPE (and drops it) instead of killing the firmware with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    if (!tiles || !mode)
        return usage("--tiles and one of --listen, --pty, --stdio are required");
    if (parse_address(tiles, &tiles_addr) < 0)
        return usage("--tiles: expected IPv4-HOST:PORT");
    if (mode == 'l' && parse_address(listen_at, &link_addr) < 0)
        return usage("--listen: expected IPv4-HOST:PORT");
    fd = connect_tiles(&tiles_addr);
    if (fd < 0) {
        fprintf(stderr, "somatile-fw: no tile server at %s\n", tiles);
        return 1;
    }
    hal_host_set_tiles(fd);
    if (mode == 'l')
        return serve_tcp(&dev, &link_addr);
    if (mode == 'p')
        return serve_pty(&dev);
    hal_host_set_link(0, 1, 0);
    fw_init(&dev);
    return fw_run(&dev) == 0 ? 0 : 1;
}
