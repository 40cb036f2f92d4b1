"""The HTTP door against its own OpenAPI document, fuzzed (DESIGN §9).

schemathesis reads ``/v1/openapi.json`` from a real ``halfpi mind`` and
sends each operation generated requests — valid ones and, in its negative
mode, invalid ones — and checks every answer: no 5xx, and every status,
content type and body conforms to the document (so every refusal is a
documented stable code). Bounded and seeded (``derandomize``): the same
cases each run, a few seconds per operation, no state kept between runs.

The event streams (tags ``streams`` and ``agui``) are left out: a stream
does not end by itself, and they have their own tests
(``tests/e2e/test_sse*.py``, ``test_durable*.py``, ``test_agui*.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.schemas import OpenApiSchema

from halfpi.gateway.http import openapi
from tests.support.http_door import base_url
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def mind_for_fuzzing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MindProcess]:
    home = tmp_path_factory.mktemp("fuzz") / "home"
    home.mkdir()
    proc = MindProcess(home)
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def door_schema(mind_for_fuzzing: MindProcess) -> OpenApiSchema:
    # The face token for the document's security scheme "bearer": schemathesis
    # sends it, and knows it, so it also checks that requests without it fail.
    config = schemathesis.Config.from_dict(
        {"auth": {"openapi": {"bearer": {"bearer": mind_for_fuzzing.token}}}}
    )
    return schemathesis.openapi.from_url(f"{base_url(mind_for_fuzzing.url)}/v1/openapi.json",
                                         config=config)


# Every operation of the document but the streams, known without a Mind;
# negative cases for those that take something a client could get wrong (a
# CORS preflight takes nothing but its Origin: any path is answered alike).
CASES = [
    pytest.param(op.operation_id, mode, id=f"{op.operation_id}-{mode.value}")
    for op in openapi.operations()
    if op.tag not in ("streams", "agui")
    for mode in GenerationMode
    if mode is GenerationMode.POSITIVE
    or ((op.parameters or op.body) and op.method != "options")
]


@pytest.mark.parametrize(("operation_id", "mode"), CASES)
def test_every_answer_conforms_to_the_document(
    door_schema: OpenApiSchema, mind_for_fuzzing: MindProcess, operation_id: str,
    mode: GenerationMode,
) -> None:
    operation = door_schema.find_operation_by_id(operation_id)
    url = base_url(mind_for_fuzzing.url)

    @settings(max_examples=10, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def conforms(case: Case) -> None:
        case.call_and_validate(base_url=url)

    conforms()


def test_the_fuzzed_mind_logged_no_internal_error(mind_for_fuzzing: MindProcess) -> None:
    assert "Traceback" not in mind_for_fuzzing.log()
