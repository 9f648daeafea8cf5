"""The wire: how fiber processes talk. Every message code is in
:mod:`~fiber.wire.protocol`; :mod:`~fiber.wire.transport` (pynng) and
:mod:`~fiber.wire.stream` (direct sockets) carry requests to channels of a process's
hub after the mutual handshake of :mod:`~fiber.wire.auth`;
:mod:`~fiber.wire.serialization` and :mod:`~fiber.wire.shm` turn objects into
messages. Nothing here knows settings, backends or processes: what it needs is passed
in."""
