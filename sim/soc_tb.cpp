// The SoC (hw/soc.py) in Verilator with its UART pins bridged to a pseudo-terminal, so that the unchanged
// serial:// driver reaches the simulated board through the same bytes, firmware and tile as a real one.
//
//   soc_tb --bit-cycles N [--clock-ps T --cpu-clock-ps C]
//
// --bit-cycles    CPU clock cycles per UART bit (the firmware's divider + 2, boards/soc.py)
// --clock-ps      the tile array's clock period (ps; built with SOC_CPU_CLOCK: the CPU side has its own clock)
// --cpu-clock-ps  the CPU side's clock period (ps), likewise
//
// Built with SOC_CPU_CLOCK (hw/soc.py with cpu_domain "cpu") the model has two clocks, clk (the array) and
// cpu_clk (CPU, memories, UART), each toggled at its own half period from one time line; otherwise one clock.
// Cycles are the CPU's either way: the UART, "stats" and the firmware count them.
//
// The first line on stdout is "pty PATH". stdin takes commands, one per line: "hold 1" / "hold 0" (the SoC's
// hold input: the tile's answers are not read, a stalled tile for the fault tests), "stats" (prints
// "cycles N"), "reset" (holds the SoC's reset for 16 cycles: the board's reset button). EOF on stdin (the parent process is gone) or SIGTERM ends the simulation. A CPU trap prints
// "trap at cycle N" on stderr and exits with status 3.
//
// The UART model is cycle-accurate at the pins: 8N1, LSB first; a received bit is sampled in the middle of
// its period; bytes from the pty are sent back to back with one stop bit.
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <memory>
#include <poll.h>
#include <string>
#include <termios.h>
#include <unistd.h>

#include "verilated.h"
#include "Vsomatile_soc.h"

namespace {

volatile std::sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

// Host -> SoC: shifts queued bytes onto the rx pin.
struct UartDriver {
    uint32_t bit_cycles;
    std::deque<uint8_t> queue;
    int bit = -1;          // -1 idle, 0 start, 1..8 data, 9 stop
    uint32_t count = 0;
    uint8_t byte = 0;

    int pin() const {
        if (bit < 0 || bit == 9) return 1;
        if (bit == 0) return 0;
        return (byte >> (bit - 1)) & 1;
    }
    void tick() {
        if (bit < 0) {
            if (queue.empty()) return;
            byte = queue.front();
            queue.pop_front();
            bit = 0;
            count = 0;
            return;
        }
        if (++count >= bit_cycles) {
            count = 0;
            bit = bit == 9 ? -1 : bit + 1;
        }
    }
};

// SoC -> host: samples the tx pin.
struct UartReceiver {
    uint32_t bit_cycles;
    int bit = -1;          // -1 idle, 0 start, 1..8 data, 9 stop
    uint32_t count = 0;
    uint8_t byte = 0;

    // Returns a byte (0..255) when one completed at this cycle, else -1.
    int tick(int pin) {
        if (bit < 0) {
            if (pin == 0) {
                bit = 0;
                count = 0;
            }
            return -1;
        }
        ++count;
        if (count == bit_cycles / 2 && bit >= 1 && bit <= 8)
            byte = static_cast<uint8_t>((byte >> 1) | (pin ? 0x80 : 0));
        if (count == bit_cycles / 2 && bit == 9) {
            bit = -1;  // resynchronise on the next start bit from the middle of the stop bit
            return byte;
        }
        if (count >= bit_cycles) {
            count = 0;
            ++bit;
        }
        return -1;
    }
};

// The clocks: step() runs one CPU clock cycle (to and including its rising edge); reset(on) drives the resets.
struct Clocks {
    Vsomatile_soc *top;
    uint64_t half_tile_ps = 1, half_cpu_ps = 1;
    uint64_t next_tile = 0, next_cpu = 0;   // the time of each clock's next toggle

    void step() {
#ifdef SOC_CPU_CLOCK
        for (;;) {
            uint64_t now = next_tile < next_cpu ? next_tile : next_cpu;
            bool cpu_rose = false;
            if (next_tile == now) { top->clk = !top->clk; next_tile += half_tile_ps; }
            if (next_cpu == now) { top->cpu_clk = !top->cpu_clk; cpu_rose = top->cpu_clk; next_cpu += half_cpu_ps; }
            top->eval();
            if (cpu_rose) return;
        }
#else
        top->clk = 0; top->eval();
        top->clk = 1; top->eval();
#endif
    }
    void reset(int on) {
        top->rst = on;
#ifdef SOC_CPU_CLOCK
        top->cpu_rst = on;
#endif
    }
};

int open_pty(std::string &path, int &slave) {
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0) return -1;
    path = ptsname(master);
    // Keeping a descriptor of the slave open means the master never reads EIO while no host has it open.
    slave = open(path.c_str(), O_RDWR | O_NOCTTY);
    if (slave < 0) return -1;
    termios t;
    tcgetattr(slave, &t);
    cfmakeraw(&t);
    tcsetattr(slave, TCSANOW, &t);
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    return master;
}

}  // namespace

int main(int argc, char **argv) {
    uint32_t bit_cycles = 0;
    uint64_t clock_ps = 0, cpu_clock_ps = 0;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--bit-cycles") == 0 && i + 1 < argc) bit_cycles = std::strtoul(argv[++i], nullptr, 10);
        else if (std::strcmp(argv[i], "--clock-ps") == 0 && i + 1 < argc) clock_ps = std::strtoull(argv[++i], nullptr, 10);
        else if (std::strcmp(argv[i], "--cpu-clock-ps") == 0 && i + 1 < argc) cpu_clock_ps = std::strtoull(argv[++i], nullptr, 10);
    }
#ifdef SOC_CPU_CLOCK
    bool clocks_ok = clock_ps >= 2 && cpu_clock_ps >= 2;
#else
    bool clocks_ok = true;
#endif
    if (bit_cycles < 4 || !clocks_ok) {
        std::fprintf(stderr, "usage: soc_tb --bit-cycles N (N >= 4) [--clock-ps T --cpu-clock-ps C (both >= 2 "
                             "with two clocks)]\n");
        return 2;
    }
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::signal(SIGPIPE, SIG_IGN);

    std::string path;
    int slave = -1;
    int master = open_pty(path, slave);
    if (master < 0) {
        std::perror("soc_tb: pty");
        return 1;
    }
    std::printf("pty %s\n", path.c_str());
    std::fflush(stdout);
    fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);

    auto context = std::make_unique<VerilatedContext>();
    auto top = std::make_unique<Vsomatile_soc>(context.get());
    UartDriver driver{bit_cycles};
    UartReceiver receiver{bit_cycles};
    uint64_t cycle = 0;
    std::string command;
    uint8_t out[256];
    size_t out_n = 0;

    Clocks clocks{top.get(), clock_ps / 2, cpu_clock_ps / 2};
    top->uart_rx = 1;
    top->hold = 0;
    clocks.reset(1);
    for (int i = 0; i < 16; ++i) clocks.step();
    clocks.reset(0);

    while (!stop_requested) {
        top->uart_rx = driver.pin();
        clocks.step();
        ++cycle;
        driver.tick();
        int b = receiver.tick(top->uart_tx);
        if (b >= 0) out[out_n++] = static_cast<uint8_t>(b);
        if (top->trap) {
            std::fprintf(stderr, "trap at cycle %llu\n", static_cast<unsigned long long>(cycle));
            return 3;
        }
        if ((cycle & 1023) != 0 && out_n < sizeof out) continue;
        // Every 1024 cycles (a byte lasts 10 bit periods, so nothing waits long): the pty both ways, stdin.
        if (out_n) {
            ssize_t w = write(master, out, out_n);
            (void)w;  // nobody reading: the bytes are lost, as on a UART
            out_n = 0;
        }
        if (driver.queue.size() < 64) {
            uint8_t in[256];
            ssize_t r = read(master, in, sizeof in);
            for (ssize_t i = 0; i < r; ++i) driver.queue.push_back(in[i]);
        }
        if ((cycle & 65535) == 0) {
            char buf[128];
            ssize_t r = read(0, buf, sizeof buf);
            if (r == 0) break;  // the parent closed our stdin: it is gone
            for (ssize_t i = 0; i < r; ++i) {
                if (buf[i] != '\n') { command += buf[i]; continue; }
                if (command == "reset") {
                    clocks.reset(1);
                    for (int k = 0; k < 16; ++k) clocks.step();
                    clocks.reset(0);
                    driver.queue.clear();
                    driver.bit = -1;
                    receiver.bit = -1;
                } else if (command == "hold 1") top->hold = 1;
                else if (command == "hold 0") top->hold = 0;
                else if (command == "stats") std::printf("cycles %llu\n", static_cast<unsigned long long>(cycle));
                else std::fprintf(stderr, "soc_tb: unknown command '%s'\n", command.c_str());
                std::fflush(stdout);
                command.clear();
            }
        }
    }
    top->final();
    close(slave);
    close(master);
    return 0;
}
