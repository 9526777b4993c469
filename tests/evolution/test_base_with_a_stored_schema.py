"""Review of 5642269: an evolution of a base version stored before its inputSchema was checked as it is written
(371c8fd), with a schema that check now refuses: every child the operators derive from it is refused."""

import pytest

from evolution.models import EvolutionRun
from evolution.services import EvolutionError, evolution_start

pytestmark = pytest.mark.django_db


def test_an_evolution_of_a_base_whose_stored_schema_is_now_refused_is_refused_at_its_start(
        support_set, version_stored_with_an_unusable_schema):
    # before, evolution_start checked the base's tools and models (version_problems), not that its DSL still
    # validates: the run started and its first step, the initial population, failed on the operators' parse
    base = version_stored_with_an_unusable_schema
    with pytest.raises(EvolutionError) as refused:
        evolution_start(workflow=base.workflow, golden_set=support_set,
                        config={"population": 2, "generations": 1, "seed": 7})
    assert any("inputSchema" in " ".join(messages) or "inputSchema" in field
               for field, messages in refused.value.errors.items()), refused.value.errors
    assert not EvolutionRun.objects.exists()
