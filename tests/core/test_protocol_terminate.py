"""`<Terminate>` is a tag of the reply, not text inside a call's JSON."""

from canvasagent.core.protocol import format_reply, parse_reply


def test_terminate_inside_a_call_is_data():
    reply = format_reply("ok", {"name": "<Terminate>", "arguments": {"text": "<Terminate>"}})
    parsed = parse_reply(reply)
    assert not parsed.terminate and parsed.call is not None and parsed.call.arguments == {"text": "<Terminate>"}
    assert parse_reply(format_reply("done", terminate=True)).terminate
