"""A direct stream wire for latency-critical channels (the Pool's task lines).

pynng's request/reply costs about 250 us per round trip on a 2-core machine: every
message passes through nng's poller and task threads before the waiting Python thread
wakes. A plain TCP stream costs about 80 us. A hub therefore also serves channels that
opt in (``Hub.add_channel(..., stream=True)``) on a TCP listener of its own, with the
same semantics as the nng wire, so channels cannot tell the two apart:

- the same mutual handshake (:mod:`fiber.wire.handshake`) comes before anything else;
- many independent request lines ("contexts") share one connection: each frame
  carries its line's number, and a reply goes back on the line of its request;
- a request may be parked and answered later, from any thread, exactly once;
- a connection that drops reports ``peer_gone`` to the hub's channels.

The modules, by job: :mod:`~fiber.wire.stream.framing` (the frame header, blocking
frame reads, addresses and connecting), :mod:`~fiber.wire.stream.server` (the
listening side, :class:`~fiber.wire.stream.server.StreamListener`, which a hub starts
on first use: ``Hub.stream_address``) and :mod:`~fiber.wire.stream.client` (the
connecting side, :class:`~fiber.wire.stream.client.StreamClient`, which
``transport.get_client("stream://...")`` gives).
"""
