"""Property-based fuzzing (Hypothesis) of every decoder that reads bytes from a peer
(issue #26, docs/security.md): none may raise anything but its documented error.

Before authentication (what a stranger, without the run's secret, can reach):

- the gate's admissions, :class:`~fiber.wire.stream.server.StreamAdmission` (the stream
  wire's :class:`~fiber.wire.handshake.HubHandshake` over frames) and
  :class:`~fiber.runtime.managers.admission.MpAdmission` (multiprocessing's authkey
  handshake), fed arbitrary bytes (and frames of arbitrary bodies) split arbitrarily,
  never more than ``want()`` at a time, as the gate feeds them: no exception, ``want()``
  in 1..the handshake's limit, the buffer never over that limit, never ``accepted``
  (waiting or refused only), and a refused admission stays refused. A client that
  holds the key, its bytes split just as arbitrarily, is accepted (the driver works);
- :meth:`HubHandshake.step` with arbitrary message sequences, replayed hub answers and
  proofs made with another key: replies are ``OK + ...`` or ``AUTH_REFUSED``, never
  ``accepted``, a refusal is final.

After authentication (a trusted peer of the run, fuzzed for robustness: a malformed
frame or request must end in an error or a dropped connection, never in an exception
that kills a hub's thread):

- the stream wire's frame reading, on the listening side (``_Connection.read``) and the
  connecting side (``StreamClient._read_frame`` and ``drain``), over a socketpair, of
  arbitrary frames and garbage written in arbitrary pieces: the frames read are those
  of a reference parser, in order; only :class:`OSError` at the end or for a length
  that cannot be allocated; ``framing.read_frame_blocking`` (None over the limit, else
  the frame, or OSError) and ``framing.split_address`` (ValueError only, a port in
  0-65535);
- ``framing.check_reply``: the payload of an OK reply, else an exception instance
  raised (the packed one, or ConnectionLostError), never a TypeError from raising
  something that is no exception; ``protocol.parse_hello`` / ``mismatch``: a dict and
  None or a sentence, for any bytes and any JSON;
- the nng hub's reassembly of PART messages (``Hub._piece``): each piece answered once
  (OK, or ERROR for a malformed one) until the last, which gives the concatenation;
- ``serialization``: the framing of message bodies (``_parse_oob``, ``_parse_shared``,
  and ``loads`` of bodies framed as such) raises only ``pickle.UnpicklingError`` (or
  ``SegmentError`` for a segment that is not there) and never slices outside the body;
  ``dumps``/``loads`` round-trip;
- the hub channels' request parsing: a queue's mailbox (``mailbox.decode``), a pipe's,
  a pool's, with arbitrary payloads: each request is answered (or parked, as a real
  one may be) or raises ValueError, which :meth:`Hub.dispatch` answers with an error.
"""

from __future__ import annotations

import json
import pickle
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fiber.errors import ConnectionLostError
from fiber.runtime.managers import stdlib
from fiber.runtime.managers.admission import MpAdmission
from fiber.wire import auth, protocol, serialization, shm
from fiber.wire.framing import check_reply
from fiber.wire.handshake import HubHandshake
from fiber.wire.protocol import (
    AUTH1,
    AUTH3,
    AUTH_REFUSED,
    CLIENT_ROLE,
    ERROR,
    GONE,
    HUB_ROLE,
    NONCE_SIZE,
    OK,
    PART,
    PART_HEADER,
)
from fiber.wire.serialization import pack_exception
from fiber.wire.stream import client as stream_client
from fiber.wire.stream import framing
from fiber.wire.stream.framing import BIG, FRAME, HANDSHAKE_MAX, frame
from fiber.wire.stream.server import StreamAdmission, _Connection

KEY = b"k" * 32
OTHER = b"o" * 32

# examples per property: enough to mean something, the file in well under a minute
MANY = settings(max_examples=500, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SOME = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- strategies -----------------------------------------------------------------------------
cuts = st.lists(st.integers(1, 40), min_size=1, max_size=20)  # piece sizes, cycled


def _stream_bodies() -> st.SearchStrategy[bytes]:
    nonce = st.binary(min_size=NONCE_SIZE, max_size=NONCE_SIZE)
    return st.one_of(
        st.binary(max_size=80),
        nonce.map(lambda n: AUTH1 + n),
        st.binary(max_size=40).map(lambda b: AUTH1 + b),
        st.binary(min_size=32, max_size=32).map(lambda b: AUTH3 + b),
        st.binary(max_size=40).map(lambda b: AUTH3 + b),
    )


def _stream_frames() -> st.SearchStrategy[bytes]:
    """A frame of a handshake-like body, or one whose header lies about its length."""
    line = st.integers(0, 2**32 - 1)
    return st.one_of(
        st.builds(frame, line, _stream_bodies()),
        st.builds(lambda size, ln, body: FRAME.pack(size, ln) + body,
                  st.one_of(st.integers(0, HANDSHAKE_MAX + 2), st.integers(0, 2**64 - 1)),
                  line, st.binary(max_size=60)),
    )


stream_input = st.one_of(
    st.binary(max_size=400),
    st.lists(st.one_of(_stream_frames(), st.binary(max_size=20)), max_size=6).map(b"".join),
)


def _mp_frame(body: bytes) -> bytes:
    return struct.pack("!i", len(body)) + body


mp_input = st.one_of(
    st.binary(max_size=400),
    st.lists(st.one_of(
        st.binary(max_size=300).map(_mp_frame),
        st.just(_mp_frame(stdlib.WELCOME)),
        st.binary(max_size=40).map(lambda b: _mp_frame(stdlib.CHALLENGE + b)),
        st.builds(lambda n, b: struct.pack("!i", n) + b,
                  st.integers(-2**31, 2**31 - 1), st.binary(max_size=40)),
        st.binary(max_size=20),
    ), max_size=6).map(b"".join),
)


# -- the gate's admissions ----------------------------------------------------------------
def _feed(admission, data: bytes, pieces: list[int], limit: int, header: int) -> list[bytes]:
    """Give ``data`` to ``admission`` as the gate does: at most ``want()`` bytes at a
    time (in pieces of the sizes ``pieces`` cycles through), checking the bounds at
    every step; the replies."""
    replies = []
    pos, i = 0, 0
    while pos < len(data) and not admission.accepted and admission.refused is None:
        want = admission.want()
        assert 1 <= want <= max(limit, header)
        n = min(want, pieces[i % len(pieces)], len(data) - pos)
        i += 1
        reply = admission.received(data[pos:pos + n])
        pos += n
        assert isinstance(reply, bytes)
        replies.append(reply)
        # private read: the admission buffer's size (the bound fuzzed)
        assert len(admission._buf) <= max(limit, header)  # memory bounded
    return replies


@MANY
@given(stream_input, cuts)
def test_stream_admission_never_admits_a_stranger(data, pieces):
    admission = StreamAdmission(HubHandshake(KEY, "stranger"))
    assert admission.opening() == b""
    replies = _feed(admission, data, pieces, HANDSHAKE_MAX, FRAME.size)
    assert not admission.accepted
    for reply in replies:
        if reply:  # a frame of OK + ..., or of the refusal
            size, _line = FRAME.unpack_from(reply)
            assert size == len(reply) - FRAME.size
            body = reply[FRAME.size:]
            assert body[:1] == OK or body == AUTH_REFUSED
    if admission.refused is not None:  # refused: stays so, whatever comes next
        assert admission.handshake.step(AUTH1 + bytes(NONCE_SIZE)) == AUTH_REFUSED
        assert not admission.handshake.accepted


@SOME
@given(cuts, st.integers(0, 2**32 - 1))
def test_stream_admission_admits_the_holder_of_the_key(pieces, line):
    admission = StreamAdmission(HubHandshake(KEY, "friend"))
    nonce = auth.new_nonce()
    (reply,) = [r for r in _feed(admission, frame(line, AUTH1 + nonce), pieces,
                                 HANDSHAKE_MAX, FRAME.size) if r]
    body = reply[FRAME.size:]
    assert body[:1] == OK and auth.verify(KEY, HUB_ROLE, nonce, body[1 + NONCE_SIZE:])
    proof = auth.answer(KEY, CLIENT_ROLE, body[1:1 + NONCE_SIZE])
    _feed(admission, frame(line, AUTH3 + proof), pieces, HANDSHAKE_MAX, FRAME.size)
    assert admission.accepted and admission.refused is None


@MANY
@given(mp_input, cuts)
def test_mp_admission_never_admits_a_stranger(data, pieces):
    admission = MpAdmission(KEY, "stranger")
    assert admission.opening()[4:].startswith(stdlib.CHALLENGE)
    _feed(admission, data, pieces, 256, 4)
    assert not admission.accepted


@SOME
@given(cuts, st.binary(min_size=1, max_size=64), st.booleans())
def test_mp_admission_admits_the_holder_of_the_key_only(pieces, nonce, right):
    """The client's side of multiprocessing's handshake, its bytes split arbitrarily;
    with another key it is refused at its first answer."""
    admission = MpAdmission(KEY, "client")
    challenge = admission.opening()[4:][len(stdlib.CHALLENGE):]
    key = KEY if right else OTHER
    (reply,) = [r for r in _feed(admission, _mp_frame(stdlib.response_to(key, challenge)),
                                 pieces, 256, 4) if r]
    if not right:
        assert admission.refused and reply == _mp_frame(stdlib.FAILURE)
        return
    assert reply == _mp_frame(stdlib.WELCOME)
    (reply,) = [r for r in _feed(admission, _mp_frame(stdlib.CHALLENGE + nonce), pieces,
                                 256, 4) if r]
    assert reply == _mp_frame(stdlib.response_to(KEY, nonce))
    _feed(admission, _mp_frame(stdlib.WELCOME), pieces, 256, 4)
    assert admission.accepted and admission.refused is None


# -- HubHandshake.step ----------------------------------------------------------------------
_step_message = st.one_of(
    _stream_bodies(),
    st.sampled_from(["reflect", "other-key"]),  # made from the hub's own answers
)


@MANY
@given(st.lists(_step_message, min_size=1, max_size=6))
def test_hub_handshake_step_never_accepts_a_stranger(messages):
    hub = HubHandshake(KEY, "stranger")
    mirror = HubHandshake(KEY, "stranger's second connection")
    hub_nonce: bytes | None = None
    refused = False
    for message in messages:
        if message == "reflect":  # the hub's challenge to us, put to another connection
            got = mirror.step(AUTH1 + (hub_nonce or bytes(NONCE_SIZE)))
            message = AUTH3 + got[1 + NONCE_SIZE:]
        elif message == "other-key":
            message = AUTH3 + auth.answer(OTHER, CLIENT_ROLE, hub_nonce or bytes(NONCE_SIZE))
        reply = hub.step(message)
        assert reply == AUTH_REFUSED or (reply[:1] == OK and len(reply) == 1 + NONCE_SIZE + 32)
        if reply[:1] == OK:
            hub_nonce = reply[1:1 + NONCE_SIZE]
        if refused:
            assert reply == AUTH_REFUSED
        refused = hub.refused is not None
        assert not hub.accepted


# -- the stream wire's frames after authentication -------------------------------------------
def _reference(data: bytes) -> list[tuple[int, bytes]]:
    """The complete frames at the start of ``data``."""
    frames, pos = [], 0
    while len(data) - pos >= FRAME.size:
        size, line = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + size
        if end > len(data):
            break
        frames.append((line, data[pos + FRAME.size:end]))
        pos = end
    return frames


# the length of a frame cut short: one the reader waits for the rest of, a big one it
# allocates (4 MiB at most: from 1 MiB frames are read into their own buffer), or one it
# cannot allocate. Every header the reader sees is one of these (garbage comes last and
# is shorter than a header; a frame's body never goes past its length): a length of a
# few TiB, which this machine's overcommit would let it allocate and then fill, is not
# fiber's to refuse from an authenticated peer
_size = st.one_of(st.integers(0, 300), st.integers(BIG, 4 * BIG), st.integers(2**56, 2**64 - 1))
_frame = st.builds(frame, st.integers(0, 2**32 - 1), st.binary(max_size=300))
_cut_short = st.builds(lambda size, line, body: FRAME.pack(size, line) + body[:size],
                       _size, st.integers(0, 2**32 - 1), st.binary(max_size=100))
wire_stream = st.builds(lambda frames, last, tail: b"".join(frames) + last + tail,
                        st.lists(_frame, max_size=6), st.one_of(st.just(b""), _cut_short),
                        st.binary(max_size=FRAME.size - 1))


def _pieces(data: bytes, pieces: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        n = pieces[i % len(pieces)] * 7
        out.append(data[pos:pos + n])
        pos, i = pos + n, i + 1
    return out


@MANY
@given(wire_stream, cuts)
def test_listening_side_reads_the_frames_and_only_raises_oserror(data, pieces):
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        conn = _Connection(None, ours)  # type: ignore[arg-type]
        got: list[tuple[int, bytes]] = []
        ended = None
        for piece in _pieces(data, pieces):
            theirs.sendall(piece)
            try:
                got += conn.read()
            except OSError as exc:
                ended = exc
                break
        if ended is None:
            theirs.shutdown(socket.SHUT_WR)
            with pytest.raises(OSError):
                for _ in range(1000):
                    got += conn.read()
        expected = _reference(data)
        assert got == expected[:len(got)]
        if ended is None and not any(size >= 2**56 for size in _sizes(data, len(got))):
            assert got == expected
    finally:
        ours.close()
        theirs.close()


def _sizes(data: bytes, frames: int) -> list[int]:
    """The announced length of the frame after the first ``frames`` frames, if any."""
    pos = 0
    for _ in range(frames):
        pos += FRAME.size + FRAME.unpack_from(data, pos)[0]
    if len(data) - pos >= FRAME.size:
        return [FRAME.unpack_from(data, pos)[0]]
    return []


def _client_over(sock: socket.socket, monkeypatch) -> stream_client.StreamClient:
    """A StreamClient on ``sock`` (connected, authenticated: the handshake is not
    what is fuzzed here)."""
    monkeypatch.setattr(stream_client, "connect", lambda *args: sock)
    monkeypatch.setattr(stream_client, "prove", lambda *args: None)
    return stream_client.StreamClient("stream://127.0.0.1:1", authkey=KEY)


@MANY
@given(wire_stream, cuts)
def test_connecting_side_reads_the_frames_and_only_raises_oserror(data, pieces):
    ours, theirs = socket.socketpair()
    with pytest.MonkeyPatch.context() as monkeypatch:
        client = _client_over(ours, monkeypatch)
    try:
        got: list[tuple[int, bytes]] = []
        writer = threading.Thread(target=_write_and_close, args=(theirs, data, pieces))
        writer.start()
        try:
            with pytest.raises(OSError):
                for _ in range(1000):
                    # private: the client's frame decoder, fuzzed directly
                    got.append(client._read_frame(None))
        finally:
            writer.join()
        expected = _reference(data)
        assert got == expected[:len(got)]
        if not any(size >= 2**56 for size in _sizes(data, len(got))):
            assert got == expected
    finally:
        client.close()
        theirs.close()


def _write_and_close(sock: socket.socket, data: bytes, pieces: list[int]) -> None:
    try:
        for piece in _pieces(data, pieces):
            sock.sendall(piece)
        sock.shutdown(socket.SHUT_WR)
    except OSError:  # the reader gave up (a length it cannot allocate) and closed
        pass


@MANY
@given(wire_stream)
def test_connecting_side_drain_queues_what_came(data):
    ours, theirs = socket.socketpair()
    with pytest.MonkeyPatch.context() as monkeypatch:
        client = _client_over(ours, monkeypatch)
    try:
        # private read: the line numbers the contexts took, and the replies filed under each
        lines = [client.context()._line for _ in range(3)]  # lines 2-4; 1 is the default
        theirs.sendall(data[:100_000])
        client.drain()
        expected = [(line, body) for line, body in _reference(data[:100_000])
                    if line in (1, *lines)]
        got = sorted((line, body) for line, queue in client._replies.items() for body in queue)
        assert got == sorted(expected)
    finally:
        client.close()
        theirs.close()


@MANY
@given(st.binary(max_size=200), st.integers(0, 300))
def test_read_frame_blocking(data, limit):
    ours, theirs = socket.socketpair()
    try:
        ours.settimeout(5)
        theirs.sendall(data)
        theirs.shutdown(socket.SHUT_WR)
        try:
            got = framing.read_frame_blocking(ours, limit)
        except OSError:
            assert len(data) < FRAME.size or len(data) < FRAME.size + FRAME.unpack_from(data)[0]
            return
        size, line = FRAME.unpack_from(data)
        if size > limit:
            assert got is None
        else:
            assert got == (line, data[FRAME.size:FRAME.size + size])
    finally:
        ours.close()
        theirs.close()


_address = st.one_of(
    st.text(max_size=60),
    st.builds(lambda host, port, rest: f"stream://{host}:{port}{rest}",
              st.text(max_size=20), st.one_of(st.integers(-10, 10**6).map(str), st.text(max_size=8)),
              st.one_of(st.just(""), st.text(max_size=20).map(lambda t: "?local=" + t),
                        st.text(max_size=20).map(lambda t: "?" + t))),
)


@MANY
@given(_address)
def test_split_address_raises_only_value_error(address):
    try:
        host, port, local = framing.split_address(address)
    except ValueError:
        return
    assert isinstance(host, str) and 0 <= port <= 65535
    assert local is None or (isinstance(local, str) and local)


# -- replies, hellos ---------------------------------------------------------------------
class _Odd:
    """Pickles, unpickles, and takes a ``__cause__``: but is no exception."""


_packed = st.one_of(
    st.sampled_from([ValueError("v"), KeyError("k"), ConnectionLostError("c")]).map(
        pack_exception),
    st.sampled_from([(_Odd(), "tb"), (1, 2), ("ab", "c"), [None, None], (), "xy", None,
                     (ValueError("v"),)]).map(lambda o: pickle.dumps(o, 5)),
)
_reply = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda status, body: status + body,
              st.sampled_from([OK, ERROR, GONE, b"\x07"]), st.one_of(_packed, st.binary(max_size=60))),
)


@MANY
@given(_reply)
def test_check_reply(reply):
    try:
        payload = check_reply(reply, "stream://peer:1")
    except ConnectionLostError:
        assert reply[:1] != OK
        return
    except (ValueError, KeyError) as exc:  # what the reply carried (any status but OK, GONE)
        assert reply[:1] not in (OK, GONE) and exc.__cause__ is not None
        return
    assert reply[:1] == OK and payload == reply[1:]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_hello = st.one_of(
    st.binary(max_size=200),
    _json.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={
        "fiber": _json, "protocol": _json, "python": _json, "pid": _json, "host": _json,
    }).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5000).map(lambda n: b"[" * n),  # nested too deep for the parser (1000)
)


@MANY
@given(_hello)
def test_parse_hello_and_mismatch(body):
    fields = protocol.parse_hello(body)
    assert isinstance(fields, dict)
    different = protocol.mismatch(fields)
    assert different is None or isinstance(different, str)
    assert protocol.mismatch(protocol.parse_hello(protocol.hello(1, "h"))) is None


# -- the nng hub's pieces ------------------------------------------------------------------
class _Request:
    """A request that records its replies."""

    def __init__(self, peer: int = 7) -> None:
        self.peer = peer
        self.answered = False
        self.replies: list[tuple[bytes, bytes]] = []

    def reply(self, data: bytes, status: bytes = OK) -> bool:
        self.replies.append((status, bytes(data)))
        was, self.answered = self.answered, True
        return not was


@pytest.fixture(scope="module")
def hub():
    from fiber.wire.hub import Hub

    hub = Hub("127.0.0.1", KEY)
    yield hub
    hub.close()


_part = st.one_of(
    st.binary(max_size=30).map(lambda b: PART + b),
    st.builds(lambda number, last, piece: PART + PART_HEADER.pack(number, last) + piece,
              st.integers(0, 3), st.one_of(st.just(0), st.integers(0, 255)),
              st.binary(max_size=40)),
)


@MANY
@given(st.lists(_part, max_size=12))
def test_hub_pieces(hub, messages):
    pipe = 10**6
    model: dict[int, bytes] = {}
    try:
        for message in messages:
            request = _Request()
            # private: the hub's reassembly of PART messages, fuzzed directly
            whole = hub._piece(request, pipe, message)
            if len(message) < 1 + PART_HEADER.size:
                assert whole is None and request.replies == [(ERROR, b"malformed request")]
                continue
            number, last = PART_HEADER.unpack_from(message, 1)
            model[number] = model.get(number, b"") + message[1 + PART_HEADER.size:]
            if last:
                assert whole == model.pop(number) and request.replies == []
            else:
                assert whole is None and request.replies == [(OK, b"")]
    finally:
        for key in [key for key in hub._parts if key[0] == pipe]:
            del hub._parts[key]


# -- message bodies -------------------------------------------------------------------------
_length = st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1))
_body = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda prefix, fields, tail: prefix + b"".join(struct.pack("<Q", f) for f in fields)
              + tail, st.sampled_from([b"\x01", b"\x02"]), st.lists(_length, max_size=6),
              st.binary(max_size=120)),
)


def _within(view: memoryview, part: memoryview) -> None:
    assert part.obj is view.obj and part.nbytes <= view.nbytes


@MANY
@given(_body)
def test_body_framing_raises_only_unpickling_error(body):
    view = memoryview(body)
    # private: the decoders of out-of-band and shared-memory bodies, fuzzed directly
    for parse in (serialization._parse_oob, serialization._parse_shared):
        try:
            parsed = parse(view)
        except pickle.UnpicklingError:
            continue
        if parse is serialization._parse_oob:
            data, buffers = parsed
            assert sum(b.nbytes for b in buffers) + data.nbytes <= len(body)
            for part in (data, *buffers):
                _within(view, part)
        else:
            name, spans, data = parsed
            assert isinstance(name, str) and spans
            _within(view, data)
    if body[:1] in (b"\x01", b"\x02"):
        try:
            framing_ok = True
            (serialization._parse_oob if body[:1] == b"\x01" else
             serialization._parse_shared)(view)
        except pickle.UnpicklingError:
            framing_ok = False
        if not framing_ok:  # loads says so, before unpickling anything
            with pytest.raises(pickle.UnpicklingError):
                serialization.loads(body)
        elif body[:1] == b"\x02":  # no such segment (a name not fiber's, or gone)
            with pytest.raises(shm.SegmentError):
                serialization.loads(body)


@SOME
@given(st.one_of(_json, st.binary(max_size=100)), st.integers(0, 3), st.integers(0, 3))
def test_dumps_loads_round_trip(value, buffers, kib):
    import numpy as np

    arrays = [np.full(kib * 40_000 + 1, i, dtype=np.uint8) for i in range(buffers)]
    body = serialization.dumps((value, arrays))
    got, got_arrays = serialization.loads(body)
    assert got == value and all((a == b).all() for a, b in zip(got_arrays, arrays, strict=True))


# -- channels' requests ----------------------------------------------------------------------
_mailbox_payload = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda op, timeout, data: struct.pack("<cd", op, timeout) + data,
              st.sampled_from([b"G", b"P", b"Q", b"L", b"S", b"H", b"D", b"J", b"T", b"X",
                               b"?"]),
              # do not wait, wait forever (parked: a hub timer per example is not needed)
              st.sampled_from([0.0, -1.0]), st.binary(max_size=20)),
)


@MANY
@given(st.lists(_mailbox_payload, max_size=6), st.integers(0, 255))
def test_queue_and_pipe_channels_answer_or_refuse_requests(hub, payloads, side):
    """Arbitrary requests to a queue's channel and a pipe's (with a side byte, the
    right ones and any): each is answered at most once, or parked, or raises
    ValueError (malformed: :meth:`Hub.dispatch` answers it with an error). An item put
    as a shared-memory descriptor that is none fails when it is read (UnpicklingError,
    or SegmentError for a segment that is not there), as its sender's fault."""
    from fiber.queues import QueueChannel
    from fiber.runtime.mailbox import Mailbox
    from fiber.runtime.pipes import PipeChannel

    queue = QueueChannel(Mailbox(hub, maxsize=2))
    pipe = PipeChannel(hub)
    for payload in payloads:
        for channel, body in ((queue, payload), (pipe, bytes([side % 2]) + payload),
                              (pipe, bytes([side]) + payload), (pipe, payload)):
            request = _Request()
            try:
                channel.handle(request, memoryview(body))
            except ValueError:
                assert not request.answered
            except (pickle.UnpicklingError, shm.SegmentError):  # a PUT_SHARED item read
                assert any(b"Q" in p[:2] for p in payloads)
            assert len(request.replies) <= 1


@MANY
@given(st.lists(st.binary(max_size=30), max_size=8))
def test_pool_channel_answers_malformed_requests(payloads):
    from fiber.runtime.pool.channel import PoolChannel
    from fiber.runtime.pool.scheduler import Scheduler

    scheduler = Scheduler(target=2, attempts_limit=3)
    channel = PoolChannel(scheduler, threading.RLock())
    for payload in payloads:
        request = _Request()
        channel.handle(request, memoryview(payload))
        if payload[:1] != protocol.PoolOp.PARTIAL or len(payload) < 10:  # PARTIAL: one-way
            assert len(request.replies) == 1
