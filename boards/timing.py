"""Which endpoints miss the clock target, from nextpnr's SDF of the routed design.

nextpnr reports one critical path per clock. On a design where thousands of endpoints are late that path says
little about what to fix, so the build also writes the routed delays as SDF (``--sdf``) and this module
computes, for every timing endpoint (a flip-flop, block RAM or DSP input with a setup check), its latest
arrival: clock-to-output at the startpoint, then every interconnect and cell delay along the longest path,
plus the endpoint's setup time. Endpoints later than the clock period are grouped by the registers the path
starts and ends at (primitive suffixes that the packer appends to a register's name are removed), so that a
report can say "2,500 endpoints from ``phase`` to ``fld``" instead of naming one of them.

The delays are the SDF's maximum (slow-corner) values, as nextpnr's own timing report uses them; the worst
arrival found here equals nextpnr's critical path delay (checked on a routed ULX3S tile).
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from dataclasses import dataclass, field

_TOKEN = re.compile(r'\s+|\(|\)|"[^"]*"|(?:\\.|[^\s()"\\])+')
# What the ECP5 and iCE40 packers append to a register's or a LUT's name (e.g. `x_TRELLIS_FF_Q_3`).
_PRIMITIVE_SUFFIX = re.compile(r"_(?:TRELLIS|SB_|CCU2|LUT4|MULT18|ALU54|DP16KD|PFUMX|L6MUX|ICESTORM|DFF)[\w$]*")
_TIMESCALE_PS = {"1ps": 1.0, "10ps": 10.0, "100ps": 100.0, "1ns": 1000.0, "10ns": 10000.0, "100ns": 100000.0}


class SdfError(ValueError):
    pass


@dataclass(frozen=True)
class EndpointGroup:
    start: str        # register (or block RAM / DSP) the paths start at
    end: str          # register the paths end at
    count: int        # endpoints (flip-flop / block input pins) of this pair later than the period
    worst_ns: float   # latest arrival (with setup) among them


@dataclass(frozen=True)
class EndpointSummary:
    period_ns: float
    timed: int                      # endpoints with a setup check reached from a startpoint
    late: int                       # of which later than the period
    worst_ns: float                 # latest arrival of all
    groups: tuple[EndpointGroup, ...] = field(default_factory=tuple)  # most late endpoints first
    domains: tuple[tuple[str, float], ...] = ()  # (clock source pin, its period) timed otherwise

    def as_dict(self) -> dict:
        return {"period_ns": self.period_ns, "timed": self.timed, "late": self.late, "worst_ns": self.worst_ns,
                "groups": [vars(g) for g in self.groups], "domains": [list(d) for d in self.domains]}


def _parse(text: str) -> list:
    stack: list[list] = [[]]
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token[0].isspace():
            continue
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) == 1:
                raise SdfError("unbalanced ')'")
            item = stack.pop()
            stack[-1].append(item)
        else:
            stack[-1].append(token)
    if len(stack) != 1 or not stack[0] or not isinstance(stack[0][0], list) or stack[0][0][:1] != ["DELAYFILE"]:
        raise SdfError("not an SDF file (expected one (DELAYFILE ...) form)")
    return stack[0][0]


def _unescape(name: str) -> str:
    return re.sub(r"\\(.)", r"\1", name)


def _worst(values: list, scale: float) -> float:
    """Largest of the (min:typ:max) triples of a delay entry, in ps."""
    numbers = [float(x) for v in values if isinstance(v, list) and v for x in v[0].split(":") if x]
    return max(numbers, default=0.0) * scale


def register_name(cell: str) -> str:
    """A packed cell's name without the packer's primitive suffixes: the register (or memory) it came from."""
    return _PRIMITIVE_SUFFIX.sub("", cell)


def endpoint_summary(sdf_text: str, period_ns: float, groups: int = 8,
                     domains: tuple[tuple[str, float], ...] = ()) -> EndpointSummary:
    """Latest arrival at every endpoint of the routed design in ``sdf_text``; the endpoints later than
    ``period_ns`` grouped by (start register, end register); the ``groups`` groups with the most late
    endpoints are kept. ``domains``: (clock source, period) pairs for the endpoints of another clock domain (an
    SoC's CPU side), late beyond that period instead. An endpoint's clock source is found from its cell's clock
    pin (the pin its setup check names) back through the SDF's interconnects and through clock buffers (output
    ``CLKO``, input ``CLKI``) to the pin that makes the clock, e.g. ``pll.pll/CLKOS``; a domain's
    source matches that pin whole or by its pin name (``CLKOS``). Net names are not used: Yosys names a clock
    net after any of its aliases, and nextpnr its buffer after the net. Every other endpoint is timed against
    ``period_ns``. Raises SdfError when a domain's source clocks no endpoint."""
    tree = _parse(sdf_text)
    scale, divider = 1.0, "/"
    for item in tree[1:]:
        if isinstance(item, list) and item[:1] == ["TIMESCALE"]:
            unit = "".join(item[1:])
            if unit not in _TIMESCALE_PS:
                raise SdfError(f"TIMESCALE {unit!r}: expected one of {', '.join(_TIMESCALE_PS)}")
            scale = _TIMESCALE_PS[unit]
        elif isinstance(item, list) and item[:1] == ["DIVIDER"] and len(item) > 1:
            divider = item[1]
    edges: dict[str, list[tuple[str, float]]] = defaultdict(list)
    clock_to_out: dict[str, float] = {}
    setup: dict[str, float] = {}
    paths: list[tuple[str, str, str, float]] = []  # (instance, input, output, delay)
    clocks: dict[str, set[str]] = defaultdict(set)
    endpoint_clock: dict[str, str] = {}   # endpoint pin -> its cell's clock pin
    driver: dict[str, str] = {}           # pin -> the pin driving it (clock pins are looked up)
    for cell in tree[1:]:
        if not isinstance(cell, list) or cell[:1] != ["CELL"]:
            continue
        instance = ""
        for part in cell[1:]:
            if part[:1] == ["INSTANCE"]:
                instance = _unescape(part[1]) if len(part) > 1 else ""
            elif part[:1] == ["DELAY"]:
                for kind in part[1:]:
                    for entry in kind[1:]:
                        if entry[:1] == ["IOPATH"]:
                            source = entry[1][-1] if isinstance(entry[1], list) else entry[1]
                            paths.append((instance, _unescape(source), _unescape(entry[2]),
                                          _worst(entry[3:], scale)))
                        elif entry[:1] == ["INTERCONNECT"]:
                            a, b = (_unescape(p).rsplit(divider, 1) for p in entry[1:3])
                            edges[f"{a[0]}/{a[1]}"].append((f"{b[0]}/{b[1]}", _worst(entry[3:], scale)))
                            driver[f"{b[0]}/{b[1]}"] = f"{a[0]}/{a[1]}"
            elif part[:1] == ["TIMINGCHECK"]:
                for check in part[1:]:
                    if check[:1] in (["SETUP"], ["SETUPHOLD"]) and len(check) >= 4:
                        pin = _unescape(check[1][-1] if isinstance(check[1], list) else check[1])
                        clock = _unescape(check[2][-1] if isinstance(check[2], list) else check[2])
                        clocks[instance].add(clock)
                        key = f"{instance}/{pin}"
                        endpoint_clock[key] = f"{instance}/{clock}"
                        setup[key] = max(setup.get(key, 0.0), _worst(check[3:4], scale))
    for instance, source, output, delay in paths:
        key = f"{instance}/{output}"
        if source in clocks[instance]:
            clock_to_out[key] = max(clock_to_out.get(key, 0.0), delay)
        else:
            edges[f"{instance}/{source}"].append((key, delay))

    # Longest paths over the DAG of pins (Kahn's order), from the clocked outputs; endpoints end a path.
    indegree: dict[str, int] = defaultdict(int)
    for outs in edges.values():
        for sink, _ in outs:
            indegree[sink] += 1
    arrival = dict(clock_to_out)
    before: dict[str, str] = {}
    ready = deque(pin for pin in set(edges) | set(clock_to_out) if indegree[pin] == 0)
    while ready:
        pin = ready.popleft()
        t = arrival.get(pin)
        for sink, delay in edges.get(pin, ()):
            if t is not None and t + delay > arrival.get(sink, -1.0):
                arrival[sink] = t + delay
                before[sink] = pin
            indegree[sink] -= 1
            if indegree[sink] == 0 and sink not in setup:
                ready.append(sink)

    def start_of(pin: str) -> str:
        seen = 0
        while pin in before and seen < 1_000_000:
            pin, seen = before[pin], seen + 1
        return pin

    def clock_source(pin: str) -> str:
        source, seen = driver.get(pin, ""), 0
        while source.endswith("/CLKO") and seen < 16:  # through a clock buffer, CLKI to CLKO (the ECP5's DCCA)
            source, seen = driver.get(f"{source[:-len('/CLKO')]}/CLKI", ""), seen + 1
        return source

    sources = {clock: clock_source(clock) for clock in set(endpoint_clock.values())} if domains else {}
    clocked: dict[str, float] = {}   # endpoint pin -> its period (ps) where a domain's source clocks it
    for name, period in domains:
        found = [pin for pin, clock in endpoint_clock.items()
                 if name in (sources[clock], sources[clock].rsplit("/", 1)[-1])]
        if not found:
            raise SdfError(f"clock source {name!r} clocks no endpoint (expected the {period:g} ns domain's "
                           f"registers)")
        clocked.update(dict.fromkeys(found, 1000.0 * period))

    def period_ps(pin: str) -> float:
        return clocked.get(pin, 1000.0 * period_ns)

    late_groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    timed = late = 0
    worst = 0.0
    for pin, t_setup in setup.items():
        if pin not in arrival:
            continue
        total = arrival[pin] + t_setup
        timed += 1
        worst = max(worst, total)
        if total > period_ps(pin):
            late += 1
            start = start_of(pin)
            late_groups[(register_name(start.rsplit("/", 1)[0]), register_name(pin.rsplit("/", 1)[0]))].append(total)
    ranked = sorted(late_groups.items(), key=lambda kv: (-len(kv[1]), -max(kv[1])))[:groups]
    kept = tuple(EndpointGroup(start=s, end=e, count=len(ts), worst_ns=round(max(ts) / 1000.0, 2))
                 for (s, e), ts in ranked)
    return EndpointSummary(period_ns=period_ns, timed=timed, late=late, worst_ns=round(worst / 1000.0, 2),
                           groups=kept, domains=tuple(domains))
