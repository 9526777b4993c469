"""The API contract, checked by schemathesis against the live test server: for every operation of
/api/schema/, generated requests (valid and invalid) as an authenticated workspace owner must never
get a 5xx, every response must conform to the schema (status code, content type, body), and every error
must be the one error shape. Path ids are the caller's real objects half the time, so operations get past
their 404 too. Bounded by MAX_EXAMPLES per operation so `make test` stays within minutes."""

import os
import zlib

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from tests.api.schema import assert_error_shape
from tests.api.schema import schema as generated_schema

MAX_EXAMPLES = int(os.environ.get("CONTRACT_EXAMPLES", "12"))
# the same examples on every run, so `make test` (and CI) is reproducible; CONTRACT_EXPLORE=1 draws new ones
DERANDOMIZE = os.environ.get("CONTRACT_EXPLORE", "") != "1"
# revoking the suite's own token would leave every later example a 401; tests/workspaces covers them
EXCLUDED = r"^/api/auth/logout"

# The schema /api/schema/ serves, generated at collection so each operation is its own test (the
# live server's copy is checked to be the same below); pytest 9 breaks schemathesis.pytest.from_fixture.
schema = schemathesis.openapi.from_dict(generated_schema()).exclude(path_regex=EXCLUDED)


@pytest.fixture
def contract(live_server, world, owner, object_ids):
    from knox.models import AuthToken

    _, token = AuthToken.objects.create(owner)
    return {"base_url": live_server.url, "headers": {"Authorization": f"Token {token}"}, "ids": object_ids(owner)}


def test_the_served_schema_is_the_one_under_test(live_server, owner):
    import requests

    served = requests.get(f"{live_server.url}/api/schema/?format=json", timeout=30).json()
    assert served["paths"].keys() == generated_schema()["paths"].keys()


@schemathesis.check
def one_error_shape(ctx, response, case):
    """Every 4xx is {"error": {"status", "code", "message"[, "fields"]}} in JSON."""
    if response.status_code >= 400:
        class Adapter:
            status_code = response.status_code
            headers = response.headers

            def __getitem__(self, name):
                return response.headers[name.lower()][0]

            def json(self):
                return response.json()

        assert_error_shape(Adapter())


# Not positive_data_acceptance: "valid per the schema" is not valid (a workspace id must be one of the
# caller's, a workflow a registered one). Not negative_data_rejection: Django's conventions are lenient on
# purpose (an empty filter `?role=` means no filter, an empty optional form field means "not given").
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, one_error_shape]


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
def test_every_operation_keeps_the_contract(case, contract):
    collection = case.operation.path.split("{", 1)[0]
    if case.path_parameters and collection in contract["ids"] and zlib.crc32(repr(case.path_parameters).encode()) % 2:
        case.path_parameters = {name: contract["ids"][collection] for name in case.path_parameters}
    case.call_and_validate(base_url=contract["base_url"], headers=contract["headers"], checks=CHECKS)
