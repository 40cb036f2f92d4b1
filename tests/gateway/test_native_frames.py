"""The native server's shortcuts around websockets' Sans-I/O protocol
(``gateway/native.py``), checked against that protocol itself, no socket:
the heartbeat's ping frame is the bytes ``send_ping`` makes; restarting the
parser between frames (to let the handshake's request and the hello go)
loses nothing; a pong is recognised only when whole and alone at a frame's
start."""

from __future__ import annotations

import gc

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.uri import parse_uri

from halfpi.gateway.native import _PONG_HEAD, PING_FRAME, LatestPongProtocol


def opened() -> tuple[LatestPongProtocol, ClientProtocol]:
    client = ClientProtocol(parse_uri("ws://127.0.0.1/v1/face"))
    client.send_request(client.connect())
    server = LatestPongProtocol()
    for chunk in client.data_to_send():
        server.receive_data(chunk)
    [request] = server.events_received()
    assert isinstance(request, Request)
    server.send_response(server.accept(request))
    for chunk in server.data_to_send():
        client.receive_data(chunk)
    client.events_received()
    assert server.state is State.OPEN and client.state is State.OPEN
    return server, client


def sent(client: ClientProtocol) -> bytes:
    return b"".join(client.data_to_send())


def test_the_heartbeat_ping_is_what_send_ping_writes() -> None:
    server, _ = opened()
    server.send_ping(b"")
    assert server.data_to_send() == [PING_FRAME]


def test_a_client_pong_to_it_starts_with_the_pong_head() -> None:
    _, client = opened()
    client.send_pong(b"")
    data = sent(client)
    assert len(data) == 6 and data.startswith(_PONG_HEAD)


def test_restarting_the_parser_lets_the_request_go_and_keeps_parsing() -> None:
    server, client = opened()
    assert server.at_frame_start()
    gc.collect()
    requests = sum(isinstance(o, Request) for o in gc.get_objects())
    server.restart_parser()
    gc.collect()
    assert sum(isinstance(o, Request) for o in gc.get_objects()) == requests - 1
    client.send_text(b'{"type":"face.hello"}')
    client.send_pong(b"")
    server.receive_data(sent(client))
    frames = [e for e in server.events_received() if isinstance(e, Frame)]
    assert [f.opcode for f in frames] == [Opcode.TEXT, Opcode.PONG]
    assert frames[0].data == b'{"type":"face.hello"}'


def test_mid_frame_the_parser_is_not_at_a_frame_start_and_is_not_restarted() -> None:
    server, client = opened()
    client.send_text(b"x" * 40)
    data = sent(client)
    server.receive_data(data[:3])  # the header taken, the rest to come
    assert not server.at_frame_start()
    parser = server.parser
    server.restart_parser()
    assert server.parser is parser  # untouched: restarting would lose the header
    server.receive_data(data[3:])
    [frame] = server.events_received()
    assert isinstance(frame, Frame) and frame.data == b"x" * 40
    assert server.at_frame_start()
