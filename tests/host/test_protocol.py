"""The wire protocol: framing, the stream parser, both ends of the link and their fault handling."""

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somatile.host import protocol
from somatile.host.device import DeviceError, DeviceTimeout, ProtocolError, Transport
from somatile.host.emu import LoopbackTransport
from somatile.host.protocol import BadFrame, Frame, FrameParser, LinkError, Opcode

LEVEL = 1


def frames(*specs):
    return b"".join(protocol.encode_frame(LEVEL, op, seq, payload) for op, seq, payload in specs)


def test_frame_layout_is_the_documented_one():
    frame = protocol.encode_frame(LEVEL, 0x02, 0x1234, b"abc")
    assert frame[:2] == b"ST" and frame[2] == LEVEL and frame[3] == 0x02
    assert struct.unpack_from("<HI", frame, 4) == (0x1234, 3)
    assert frame[10:13] == b"abc"
    assert int.from_bytes(frame[13:], "little") == zlib.crc32(frame[:13])


@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=5), noise=st.binary(max_size=40),
       cuts=st.lists(st.integers(0, 2000), max_size=20))
def test_parser_finds_every_frame_whatever_the_read_boundaries(payloads, noise, cuts):
    # Noise without the magic pair before the frames; frames split at arbitrary points across reads.
    noise = noise.replace(b"S", b"s")
    stream = noise + frames(*((0x02, i, p) for i, p in enumerate(payloads)))
    parser = FrameParser(1024)
    events = []
    start = 0
    for cut in sorted(set(c % (len(stream) + 1) for c in cuts)) + [len(stream)]:
        events += parser.feed(stream[start:cut])
        start = cut
    assert events == [Frame(LEVEL, 0x02, i, p) for i, p in enumerate(payloads)]


def test_parser_drops_bad_crc_oversize_and_truncated_frames_then_recovers():
    good = frames((0x01, 5, b"ok"))
    corrupt = bytearray(frames((0x02, 6, b"payload")))
    corrupt[12] ^= 0x40
    oversize = protocol.HEADER.pack(b"ST", LEVEL, 0x02, 7, 4097)
    parser = FrameParser(4096)
    events = parser.feed(bytes(corrupt) + oversize + good)
    assert events == [BadFrame(LinkError.BAD_CRC, 0x02, 6), BadFrame(LinkError.OVERSIZE, 0x02, 7, 4096),
                      Frame(LEVEL, 0x01, 5, b"ok")]
    assert parser.feed(good[:12]) == []
    assert parser.expire() == [BadFrame(LinkError.TRUNCATED, 0x01, 5)]
    assert parser.feed(good) == [Frame(LEVEL, 0x01, 5, b"ok")]
    assert parser.feed(b"S") == [] and parser.expire() == []


class Counter:
    """Handlers that record how often they ran."""

    def __init__(self):
        self.calls = 0

    def hello(self, payload):
        return b"hi"

    def work(self, payload):
        self.calls += 1
        if payload == b"refuse":
            raise protocol.CommandError(LinkError.BAD_LENGTH, 42)
        return payload[::-1]


def endpoint():
    counter = Counter()
    return counter, protocol.DeviceEndpoint(LEVEL, {Opcode.HELLO: counter.hello, Opcode.TILE: counter.work})


def parse_all(data):
    return FrameParser(1 << 20).feed(data)


def test_endpoint_replays_a_repeated_seq_without_executing_twice():
    counter, ep = endpoint()
    assert parse_all(ep.feed(frames((Opcode.HELLO, 9, b""))))[0].payload == b"hi"
    request = frames((Opcode.TILE, 10, b"abc"))
    first, again = ep.feed(request), ep.feed(request)
    assert first == again and parse_all(first)[0].payload == b"cba"
    assert counter.calls == 1



def test_endpoint_refuses_a_reused_seq_with_another_opcode_instead_of_replaying():
    # Found by the differential fuzz run: HELLO seq 0 then a TILE request also numbered 0 used to get the
    # cached HELLO answer. A retry repeats seq and opcode; anything else with the last seq is refused.
    counter, ep = endpoint()
    ep.feed(frames((Opcode.HELLO, 0, b"")))
    (answer,) = parse_all(ep.feed(frames((Opcode.TILE, 0, b"abc"))))
    assert answer.opcode == protocol.ERROR_OPCODE
    assert protocol.ERROR_PAYLOAD.unpack(answer.payload) == (LinkError.SEQUENCE, Opcode.TILE, 0, 1)
    assert counter.calls == 0
    (answer,) = parse_all(ep.feed(frames((Opcode.TILE, 1, b"abc"))))
    assert answer.payload == b"cba" and counter.calls == 1


def test_endpoint_refuses_a_reused_seq_and_opcode_with_another_payload_instead_of_replaying():
    # Issue 24: the cached answer of "abc" came back for "xyz". A retry repeats the payload too.
    counter, ep = endpoint()
    ep.feed(frames((Opcode.HELLO, 0, b"")))
    assert parse_all(ep.feed(frames((Opcode.TILE, 1, b"abc"))))[0].payload == b"cba"
    (answer,) = parse_all(ep.feed(frames((Opcode.TILE, 1, b"xyz"))))
    assert protocol.ERROR_PAYLOAD.unpack(answer.payload) == (LinkError.SEQUENCE, Opcode.TILE, 1, 2)
    assert parse_all(ep.feed(frames((Opcode.TILE, 1, b"abc"))))[0].payload == b"cba"  # the true retry
    assert counter.calls == 1

def test_endpoint_refuses_wrong_seq_wrong_level_and_unknown_opcode():
    counter, ep = endpoint()
    (answer,) = parse_all(ep.feed(frames((Opcode.TILE, 3, b"x"))))  # before HELLO
    assert answer.opcode == protocol.ERROR_OPCODE
    assert protocol.ERROR_PAYLOAD.unpack(answer.payload) == (LinkError.SEQUENCE, Opcode.TILE, 3, 0)
    ep.feed(frames((Opcode.HELLO, 3, b"")))
    (answer,) = parse_all(ep.feed(frames((Opcode.TILE, 9, b"x"))))
    assert protocol.ERROR_PAYLOAD.unpack(answer.payload) == (LinkError.SEQUENCE, Opcode.TILE, 9, 4)
    (answer,) = parse_all(ep.feed(protocol.encode_frame(LEVEL + 1, Opcode.TILE, 4, b"x")))
    assert protocol.ERROR_PAYLOAD.unpack(answer.payload) == (LinkError.WRONG_API_LEVEL, Opcode.TILE, 4, LEVEL)
    (answer,) = parse_all(ep.feed(frames((0x66, 4, b""))))
    assert protocol.ERROR_PAYLOAD.unpack(answer.payload) == (LinkError.UNKNOWN_OPCODE, 0x66, 4, 0x66)
    (answer,) = parse_all(ep.feed(frames((Opcode.TILE, 5, b"y"))))
    assert answer.payload == b"y" and counter.calls == 1


class Faulty(Transport):
    """A loopback transport that damages chosen host->device writes or drops chosen answers."""

    def __init__(self, inner, corrupt=(), drop=(), silent=False):
        self.inner, self.corrupt, self.drop, self.silent = inner, set(corrupt), set(drop), silent
        self.writes = 0

    def write(self, data):
        self.writes += 1
        if self.silent:
            return
        if self.writes in self.corrupt:
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
        self.inner.write(bytes(data))
        if self.writes in self.drop:
            self.inner.read(1 << 20, 0.0)

    def read(self, n, timeout):
        return self.inner.read(n, timeout) if not self.silent else b""


def link_over(transport, **kw):
    return protocol.WireLink(transport, LEVEL, timeout=0.05, **kw)


def test_link_retries_a_corrupted_request_and_a_lost_answer_executing_once():
    counter, ep = endpoint()
    faulty = Faulty(LoopbackTransport(ep), corrupt={2}, drop={4})
    link = link_over(faulty)
    link.request(Opcode.HELLO, b"", _first=True)
    assert link.request(Opcode.TILE, b"one") == b"eno"  # write 2 corrupted: BAD_CRC, resent
    assert link.request(Opcode.TILE, b"two") == b"owt"  # answer to write 4 lost: timeout, resent, replayed
    assert counter.calls == 2 and link.retried == 2


def test_link_raises_device_errors_naming_the_command_and_code():
    _, ep = endpoint()
    link = link_over(LoopbackTransport(ep))
    link.request(Opcode.HELLO, b"", _first=True)
    with pytest.raises(DeviceError, match="TILE.*BAD_LENGTH.*detail 42") as info:
        link.request(Opcode.TILE, b"refuse")
    assert info.value.code == LinkError.BAD_LENGTH and info.value.command == "TILE"
    assert link.request(Opcode.TILE, b"next") == b"txen"


def test_link_reports_wrong_api_level_and_silence():
    _, ep = endpoint()
    with pytest.raises(ProtocolError, match="API level 1, this host API level 2"):
        protocol.WireLink(LoopbackTransport(ep), LEVEL + 1, timeout=0.05).request(Opcode.HELLO, b"", _first=True)
    with pytest.raises(DeviceTimeout, match="HELLO .*3 attempts"):
        link_over(Faulty(None, silent=True), retries=2).request(Opcode.HELLO, b"", _first=True)


def test_oversized_request_is_refused_before_sending():
    link = link_over(Faulty(None, silent=True), max_payload=16)
    with pytest.raises(ValueError, match="exceeds the device's max_payload 16"):
        link.request(Opcode.TILE, bytes(17))


def test_generated_c_header_carries_every_constant():
    header = protocol.c_header()
    for op in Opcode:
        assert f"#define WIRE_OP_{op.name} 0x{op:02X}u" in header
    for err in LinkError:
        assert f"#define WIRE_ERR_{err.name} {int(err)}u" in header
    assert f"#define WIRE_INFO_SIZE {protocol.INFO_FORMAT.size}u" in header


def test_hello_reports_every_tile_parameter():
    from somatile.hw import regmap

    assert set(protocol.TILE_INFO_REGISTERS) == set(regmap.INFO_FIELDS) - {"tile_index"}
