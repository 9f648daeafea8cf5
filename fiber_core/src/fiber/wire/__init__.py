"""The wire: how fiber processes talk. Nothing here knows settings, backends or
processes: what it needs is passed in.

- :mod:`~fiber.wire.protocol`: every message code and format, and the versions a job
  and its parent must share;
- :mod:`~fiber.wire.auth` (the run's secret, HMAC) and :mod:`~fiber.wire.handshake`
  (the mutual challenge that opens every connection, for both wires);
- :mod:`~fiber.wire.hub`: a process's listening side, serving numbered channels
  (:mod:`~fiber.wire.channel`) over pynng and, for channels that opt in, over the
  direct stream wire (:mod:`~fiber.wire.stream`); :mod:`~fiber.wire.timers` runs its
  deadlines;
- :mod:`~fiber.wire.nng_client` and :mod:`~fiber.wire.stream.client`: the connecting
  sides; :mod:`~fiber.wire.framing` builds their requests and reads their replies;
- :mod:`~fiber.wire.transport`: the process-wide hubs and shared client connections,
  the runtime's entry point;
- :mod:`~fiber.wire.serialization` and :mod:`~fiber.wire.shm`: objects to messages.
"""
