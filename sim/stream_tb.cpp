// A unit with one valid/ready input stream and one valid/ready output stream in Verilator, fed from a file of
// input beats and drained into a file of output beats, with no Python in the per-cycle loop (sim/stream.py
// builds it and writes the stream_ports.h that names the unit's ports).
//
//   stream_tb --in FILE --out FILE --expect N [--setup FILE] [--in-cycles FILE] [--out-cycles FILE]
//             [--idle P] [--stall P] [--seed S] [--max-cycles N]
//
// --in          input beats: fixed-size records, each the input fields in stream_ports.h order, every field
//               little-endian in ceil(width / 8) bytes
// --setup       beats for the setup stream (a configuration port), all sent before the first input beat
// --out         output beats written in the same record format as the output fields
// --expect      output beats to collect; the run ends when they are in or after --max-cycles
// --in-cycles   the cycle at which each input beat was accepted (u64 each)
// --out-cycles  the cycle at which each output beat was taken (u64 each)
// --idle        probability that the source leaves a cycle idle before presenting its next beat (a presented
//               beat stays valid until it is taken, as AXI4-Stream requires)
// --stall       probability that the output ready is low in a cycle
// --seed        seed of both draws (splitmix64)
//
// Handshakes are sampled with the clock low after the cycle's inputs are applied, then the clock rises.
// stdout gets one JSON line: cycles (first input beat accepted to last output beat taken, inclusive), the
// beats moved, whether the run timed out, the wall and CPU seconds of the cycle loop and the report ports'
// final values.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ctime>
#include <string>
#include <vector>

#include "verilated.h"
#include "stream_ports.h"

namespace {

struct Options {
    std::string in, out, setup, in_cycles, out_cycles;
    uint64_t expect = 0, max_cycles = 0, seed = 1;
    double idle = 0.0, stall = 0.0;
};

struct SplitMix {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    bool draw(double p) { return p > 0 && static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
};

template <typename T> void put(T &port, const uint8_t *bytes, size_t n) {
    uint64_t value = 0;
    std::memcpy(&value, bytes, n);
    port = static_cast<T>(value);
}

template <std::size_t W> void put(VlWide<W> &port, const uint8_t *bytes, size_t n) {
    for (std::size_t w = 0; w < W; ++w) {
        uint32_t word = 0;
        if (4 * w < n) std::memcpy(&word, bytes + 4 * w, std::min<size_t>(4, n - 4 * w));
        port.data()[w] = word;
    }
}

template <typename T> void get(const T &port, uint8_t *bytes, size_t n) {
    uint64_t value = port;
    std::memcpy(bytes, &value, n);
}

template <std::size_t W> void get(const VlWide<W> &port, uint8_t *bytes, size_t n) {
    for (std::size_t w = 0; w < W && 4 * w < n; ++w) {
        uint32_t word = port.data()[w];
        std::memcpy(bytes + 4 * w, &word, std::min<size_t>(4, n - 4 * w));
    }
}

template <typename T> unsigned long long scalar(const T &port) { return port; }

double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

#define FIELD_BYTES(name, bytes) +(bytes)
constexpr size_t IN_BYTES = 0 IN_FIELDS(FIELD_BYTES);
constexpr size_t OUT_BYTES = 0 OUT_FIELDS(FIELD_BYTES);
#ifdef SETUP_FIELDS
constexpr size_t SETUP_BYTES = 0 SETUP_FIELDS(FIELD_BYTES);
#endif

std::vector<uint8_t> read_file(const std::string &path, size_t record) {
    std::vector<uint8_t> data;
    if (path.empty()) return data;
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) {
        std::fprintf(stderr, "stream_tb: cannot open %s\n", path.c_str());
        std::exit(2);
    }
    std::fseek(f, 0, SEEK_END);
    data.resize(static_cast<size_t>(std::ftell(f)));
    std::fseek(f, 0, SEEK_SET);
    if (!data.empty() && std::fread(data.data(), 1, data.size(), f) != data.size()) {
        std::fprintf(stderr, "stream_tb: short read of %s\n", path.c_str());
        std::exit(2);
    }
    std::fclose(f);
    if (data.size() % record) {
        std::fprintf(stderr, "stream_tb: %s holds %zu bytes, not a whole number of %zu-byte records\n",
                     path.c_str(), data.size(), record);
        std::exit(2);
    }
    return data;
}

void write_file(const std::string &path, const void *data, size_t n) {
    if (path.empty()) return;
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f || (n && std::fwrite(data, 1, n, f) != n)) {
        std::fprintf(stderr, "stream_tb: cannot write %s\n", path.c_str());
        std::exit(2);
    }
    std::fclose(f);
}

Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string key = argv[i];
        const char *value = argv[i + 1];
        if (key == "--in") o.in = value;
        else if (key == "--out") o.out = value;
        else if (key == "--setup") o.setup = value;
        else if (key == "--in-cycles") o.in_cycles = value;
        else if (key == "--out-cycles") o.out_cycles = value;
        else if (key == "--expect") o.expect = std::strtoull(value, nullptr, 10);
        else if (key == "--max-cycles") o.max_cycles = std::strtoull(value, nullptr, 10);
        else if (key == "--seed") o.seed = std::strtoull(value, nullptr, 10);
        else if (key == "--idle") o.idle = std::strtod(value, nullptr);
        else if (key == "--stall") o.stall = std::strtod(value, nullptr);
        else {
            std::fprintf(stderr, "stream_tb: unknown option %s\n", key.c_str());
            std::exit(2);
        }
    }
    if (o.in.empty() || o.out.empty()) {
        std::fprintf(stderr, "usage: stream_tb --in FILE --out FILE --expect N [options: see stream_tb.cpp]\n");
        std::exit(2);
    }
    return o;
}

}  // namespace

int main(int argc, char **argv) {
    Options opt = parse(argc, argv);
    std::vector<uint8_t> in = read_file(opt.in, IN_BYTES);
    const uint64_t in_beats = in.size() / IN_BYTES;
    if (opt.max_cycles == 0) opt.max_cycles = 64 * (in_beats + opt.expect) + 100000;

    auto context = std::make_unique<VerilatedContext>();
    auto top = std::make_unique<TOP_CLASS>(context.get());
    SplitMix idle_rng{opt.seed * 2 + 1}, stall_rng{opt.seed * 2 + 2};
    std::vector<uint8_t> out(opt.expect * OUT_BYTES);
    std::vector<uint64_t> accepted, taken;
    accepted.reserve(opt.in_cycles.empty() ? 0 : in_beats);
    taken.reserve(opt.out_cycles.empty() ? 0 : opt.expect);

    TIE_LOW(top);
    top->IN_VALID = 0;
    top->OUT_READY = 0;
    for (int i = 0; i < RESET_CYCLES; ++i) {  // the wrapper holds the unit's rst high meanwhile
        top->clk = 0; top->eval();
        top->clk = 1; top->eval();
    }

    uint64_t cycle = 0;
#ifdef SETUP_FIELDS
    std::vector<uint8_t> setup = read_file(opt.setup, SETUP_BYTES);
    for (size_t k = 0; k < setup.size() / SETUP_BYTES; ++cycle) {
        const uint8_t *p = &setup[k * SETUP_BYTES];
#define PUT_SETUP(name, bytes) put(top->name, p, bytes); p += bytes;
        SETUP_FIELDS(PUT_SETUP)
        top->SETUP_VALID = 1;
        top->clk = 0; top->eval();
        if (SETUP_ACCEPTED(top)) ++k;
        top->clk = 1; top->eval();
    }
    top->SETUP_VALID = 0;
#endif

    auto started = std::chrono::steady_clock::now();
    const double cpu_started = cpu_seconds();
    uint64_t sent = 0, got = 0, first_in = 0, last_out = 0;
    bool presenting = false;
    const uint64_t end_cycle = cycle + opt.max_cycles;
    for (; got < opt.expect && cycle < end_cycle; ++cycle) {
        if (!presenting && sent < in_beats && !idle_rng.draw(opt.idle)) {
            const uint8_t *p = &in[sent * IN_BYTES];
#define PUT_IN(name, bytes) put(top->name, p, bytes); p += bytes;
            IN_FIELDS(PUT_IN)
            presenting = true;
        }
        const bool ready = !stall_rng.draw(opt.stall);
        top->IN_VALID = presenting;
        top->OUT_READY = ready;
        top->clk = 0; top->eval();
        if (presenting && top->IN_READY) {
            if (sent == 0) first_in = cycle;
            if (!opt.in_cycles.empty()) accepted.push_back(cycle);
            ++sent;
            presenting = false;
        }
        if (ready && top->OUT_VALID) {
            uint8_t *p = &out[got * OUT_BYTES];
#define GET_OUT(name, bytes) get(top->name, p, bytes); p += bytes;
            OUT_FIELDS(GET_OUT)
            if (!opt.out_cycles.empty()) taken.push_back(cycle);
            last_out = cycle;
            ++got;
        }
        top->clk = 1; top->eval();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double cpu = cpu_seconds() - cpu_started;
    top->IN_VALID = 0;
    top->OUT_READY = 0;
    top->clk = 0; top->eval();

    write_file(opt.out, out.data(), got * OUT_BYTES);
    write_file(opt.in_cycles, accepted.data(), accepted.size() * sizeof(uint64_t));
    write_file(opt.out_cycles, taken.data(), taken.size() * sizeof(uint64_t));
    std::printf("{\"cycles\": %llu, \"cycles_run\": %llu, \"beats_in\": %llu, \"beats_out\": %llu, "
                "\"timeout\": %s, \"seconds\": %.6f, \"cpu_seconds\": %.6f, \"report\": {",
                got ? static_cast<unsigned long long>(last_out - first_in + 1) : 0ull,
                static_cast<unsigned long long>(cycle), static_cast<unsigned long long>(sent),
                static_cast<unsigned long long>(got), got < opt.expect ? "true" : "false", seconds, cpu);
    const char *separator = "";
#define PRINT_REPORT(member, name) std::printf("%s\"%s\": %llu", separator, name, scalar(top->member)); separator = ", ";
    REPORT_PORTS(PRINT_REPORT)
    std::printf("}}\n");
    top->final();
    return 0;
}
