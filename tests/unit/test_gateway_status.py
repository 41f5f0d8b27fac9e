"""The host gateway's statuses follow from an error's code alone: the same refusal, the same status, on
every route."""

from treemail.domain.errors import Code
from treemail.entrypoints.gatewaywire import status_of


def test_each_kind_of_refusal_has_its_status():
    assert status_of({"code": "send_message:inbox_full", "retry_after_ms": 250}) == 429
    assert status_of({"code": "send_message:engine_shutdown"}) == 503
    assert status_of({"code": "send_message:draining"}) == 503
    assert status_of({"code": "send_message:unknown_session"}) == 404
    assert status_of({"code": "message:unknown"}) == 404
    assert status_of({"code": "lifecycle:unknown_session"}) == 404
    assert status_of({"code": "send_message:invalid_arguments"}) == 400
    assert status_of({"code": "identifier:too_long"}) == 400
    assert status_of({"code": "gateway:invalid_request"}) == 400
    assert status_of({"code": "permission_denied"}) == 403
    assert status_of({"code": "interrupt_agent:permission_denied"}) == 403
    assert status_of({"code": "send_message:idempotency_conflict"}) == 409
    assert status_of({"code": "lifecycle:run_active"}) == 409
    assert status_of({"code": "send_message:sender_not_live"}) == 409
    assert status_of({"code": "gateway:internal"}) == 500
    assert status_of({"code": "gateway:request_too_large"}) == 413


def test_every_stable_code_maps_to_a_client_or_availability_status():
    for code in Code:
        assert status_of({"code": code.value}) in (400, 403, 404, 409, 503), code
