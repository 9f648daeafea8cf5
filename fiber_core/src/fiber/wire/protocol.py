"""fiber's wire protocol: every message code of every channel kind, in one place.

Every exchange between fiber processes is a *request* on a numbered *channel* of the
receiving process's hub, answered by exactly one *reply* (see :mod:`fiber.wire.hub`).
This module defines the bytes both sides agree on; the modules that speak a channel
kind import its codes from here. :data:`PROTOCOL_VERSION` changes whenever any of them
changes meaning, and a job reports it (with fiber's and Python's versions) in its
hello: a job that differs from its parent is refused before anything else is
unpickled (:func:`hello`, :func:`mismatch`).

Frames
  nng: a request is ``MSG + channel (8 bytes, little endian) + payload``; the stream
  wire wraps the same bytes in ``length (8 bytes) + line (4 bytes) + body``
  (:data:`STREAM_FRAME`; a reply comes back on the line of its request), at an address
  ``stream://HOST:PORT[?local=NAME]`` (NAME: an abstract Unix socket on that host).
  A reply starts with a status byte: :data:`OK`, :data:`ERROR` (a packed exception or
  a plain message follows) or :data:`GONE` (the channel no longer exists).

Handshake (:mod:`fiber.wire.handshake`), before any other message of a connection
  ``AUTH1 + nonce`` (32 random bytes) from the connecting side, answered by
  ``OK + nonce' + proof`` where proof is ``HMAC-SHA256(secret, HUB_ROLE + nonce)``;
  then ``AUTH3 + proof'`` (``HMAC-SHA256(secret, CLIENT_ROLE + nonce')``), answered by
  ``OK``. A hub answers anything else with :data:`AUTH_REFUSED` and closes the
  connection. On the stream wire these messages are frame bodies like any other.

Bounds before authentication (:mod:`fiber.wire.gate`, :mod:`fiber.wire.hub`)
  The nng hub receives no message longer than :data:`NNG_RECV_MAX` from anyone, so an
  authenticated client sends a longer request in pieces: ``PART + PART_HEADER +
  piece``, each answered ``OK`` but the last, which is answered as the whole request.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from typing import Any

from fiber._version import __version__

PROTOCOL_VERSION = 3  # 2: pool results go back as tasks finish (PoolOp.PARTIAL);
#                       3: the pool takes back tasks not started (PoolOp.GIVE, RECALL)

# -- framing and replies ------------------------------------------------------------------
MSG = b"M"
CHANNEL = struct.Struct("<Q")  # the channel number after MSG
AUTH1 = b"A1"
NONCE_SIZE = 32
AUTH3 = b"A3"
HUB_ROLE = b"hub"  # what the hub's proof signs before the client's nonce
CLIENT_ROLE = b"client"  # what the client's proof signs before the hub's nonce
OK = b"\x00"
ERROR = b"\x01"
GONE = b"\x02"
AUTH_REFUSED = ERROR + b"authentication failed"
PART = b"P"  # nng: PART + PART_HEADER + a piece of a request too long for one message
PART_HEADER = struct.Struct("<QB")  # the request's number on its connection, last piece?
NNG_MESSAGE_MAX = 128 * 1024  # longer requests go over nng in pieces of this size
# what the nng hub receives in one message: a stranger's message can be no longer (nng
# drops the connection before reading more), and authenticated requests come in pieces
NNG_RECV_MAX = NNG_MESSAGE_MAX + 64
NNG_MAX_PENDING = 64  # nng connections authenticating at once; the oldest is closed
STREAM_FRAME = struct.Struct("<QI")  # stream wire: body length, line
STREAM_SCHEME = "stream://"
AUTH_TIMEOUT = 10.0  # seconds a new connection has to authenticate
CONNECT_TIMEOUT = 10.0


class Control:
    """A job's control channel on its parent's hub (:mod:`fiber.runtime.popen`)."""

    HELLO = b"H"  # the job is up: its versions, pid and host (see hello())
    OUTPUT = b"O"  # + stream (b"1" stdout, b"2" stderr) + text: lines it printed
    WATCH = b"W"  # heartbeat: parked by the parent, answered every heartbeat_interval
    # (b"" to beat; END_TERM / END_KILL: the parent asks the job to signal itself)
    EXIT = b"X"  # + pickled exit code
    FAILED = b"F"  # + traceback text: it could not prepare to run the process
    # + text: a shipped job's stub cannot run it on its host (fiber.runtime.ship.stub:
    # an incompatible Python, a foreign cache directory, a full disk); sent before HELLO
    SHIPPING = b"S"
    END_TERM = b"T"  # a WATCH answer: SIGTERM yourself (Process.terminate())
    END_KILL = b"K"  # a WATCH answer: SIGKILL yourself (Process.kill())


class MailboxOp:
    """Requests to a mailbox (queues, pipes: :mod:`fiber.runtime.mailbox`). The
    payload is :data:`MAILBOX_HEADER` (op, timeout; < 0 forever, 0 do not wait) + data."""

    GET = b"G"  # data: the reader's host token (empty: no shared memory)
    PUT = b"P"  # data: the item
    PUT_SHARED = b"Q"  # data: a shared-memory descriptor of the item
    POLL = b"L"
    SIZE = b"S"
    OWNER = b"H"  # may the writer put shared-memory items? (pid and host token)
    TASK_DONE = b"D"
    JOIN = b"J"


MAILBOX_HEADER = struct.Struct("<cd")


class MailboxReply:
    ITEM = b"I"
    EMPTY = b"E"
    ACCEPTED = b"A"
    FULL = b"F"
    CLOSED = b"C"
    SHARED = b"M"  # an item whose buffers are in a shared-memory segment


class PipeOp:
    """Requests to a pipe (:mod:`fiber.runtime.pipes`): ``side (1 byte)`` + a mailbox
    request, or one of these."""

    RECEIVED = b"T"  # a process received a copy of this end (+ its transit token)
    RELEASED = b"X"  # a process closed its copy of this end


PIPE_SIDE = struct.Struct("<B")
PIPE_TOKEN = struct.Struct("<Q")


class PoolOp:
    """A pool worker's requests on its pool's channel, each with :data:`POOL_HEADER`
    (worker id, line), and the pool's replies (:mod:`fiber.runtime.pool`)."""

    READY = b"R"  # a line is open for a batch
    RESULTS = b"D"  # + BATCH_TIME + the batch's results not sent in a PARTIAL; the line
    #                 is open again
    PARTIAL = b"P"  # + results of tasks of this line's batch, sent as they finish
    #                 while the rest of the batch runs (one-way: never answered)
    STARTED = b"B"  # the worker begins a batch of suspect tasks (third line)
    GIVE = b"G"  # + ids of tasks of this line's batch that the worker gives back (none
    #              when it opens); its give line (a fourth, opened when a batch has
    #              BatchFlag.OPEN_GIVE, closed by STOP; it may go over another of the
    #              worker's connections to the same hub) waits for the next RECALL
    STOP = b"S"  # reply: retire this line
    TASKS = b"T"  # reply: + a batch
    RECALL = b"C"  # reply to GIVE: + (line, batch number on that line, task ids): give
    #                back those the worker has not started


POOL_HEADER = struct.Struct("<QB")
#: after a RESULTS message's POOL_HEADER: the seconds the batch's tasks ran (the
#: worker's own clock) and how many ran; the pool's estimate of a task's time (which
#: decides batching) comes from these, not from when results reach a busy master
BATCH_TIME = struct.Struct("<fI")


class StatusOp:
    """Requests to a program's status channel (:mod:`fiber.runtime.status`, read by
    ``fiber top``); the reply is JSON."""

    SNAPSHOT = b"S"  # the program's pools, their workers and tasks
    # the tail of one worker's job log: b"L" + JSON {"pool": id, "worker": id}
    LOG = b"L"


class BatchFlag:
    """Flags of a ``TASKS`` answer, ``(flags, batch)`` or ``(flags, batch, forget)``
    (``forget``: ids of functions the parent freed, which the worker drops): a bool
    (True: a suspect batch) or these bits."""

    SUSPECT = 1  # the worker confirms with STARTED that it begins the batch
    OPEN_GIVE = 2  # open the give line (a GIVE request) if it is closed
    # no task of the batch can be recalled (one task, sent to a worker holding none:
    # the task in progress is never recalled), so the worker runs it without taking
    # its Giver's lock (runtime/pool/worker.py)
    KEPT = 8  # (4 is free: it was kept for a flag that did not land)


class TaskKind:
    CALL = 0  # apply: (args, kwds)
    MAP = 1  # a chunk of items, func(x)
    STARMAP = 2  # a chunk of argument tuples, func(*x)


# -- message bodies (fiber.wire.serialization) ------------------------------------------------
BODY_OUT_OF_BAND = b"\x01"  # buffers appended (in-band messages are plain pickles: b"\x80")
BODY_SHARED = b"\x02"  # buffers in a shared-memory segment
BODY_LENGTH = struct.Struct("<Q")


# -- versions ---------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    """What a job and its parent must agree on."""
    return {"fiber": __version__, "protocol": str(PROTOCOL_VERSION),
            "python": "{}.{}".format(*sys.version_info[:2])}


def hello(pid: int, host: str) -> bytes:
    """The body of a job's HELLO: plain JSON, readable by any fiber version."""
    return json.dumps({**versions(), "pid": pid, "host": host}).encode()


def hello_maker(host: str) -> Callable[[int], bytes]:
    """:func:`hello` for ``host``, encoded once: the function of a pid that returns
    the same fields (a process that forks jobs makes it for them: encoding JSON in
    each job copied some sixty of its parent's memory pages)."""
    head = json.dumps({**versions(), "host": host})[:-1].encode() + b', "pid": '

    def make(pid: int) -> bytes:
        return head + str(pid).encode() + b"}"

    return make


def parse_hello(body: bytes | memoryview) -> dict[str, Any]:
    """The fields of a HELLO body; an unreadable one (a fiber before protocol 1, or not
    JSON at all, nested too deep included) gives ``{}``, which :func:`mismatch` reports.
    Raises nothing."""
    try:
        fields = json.loads(bytes(body).decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return fields if isinstance(fields, dict) else {}


def describe(fields: dict[str, Any]) -> str:
    return "fiber {fiber}, protocol {protocol}, Python {python}".format(
        **{k: fields.get(k, "unknown") for k in ("fiber", "protocol", "python")})


def mismatch(theirs: dict[str, Any]) -> str | None:
    """None when a peer's versions (from :func:`parse_hello`) match this process's,
    else a sentence naming both."""
    ours = versions()
    if all(str(theirs.get(key)) == value for key, value in ours.items()):
        return None
    return f"the job runs {describe(theirs)}; its parent runs {describe(ours)}"
