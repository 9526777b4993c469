"""The knowledge demo of `make run`: the skill pack and a small knowledge base, as the README describes it."""

import re
from io import StringIO

import pytest

from config.supervisor import BASE_DIR
from knowledge import demo
from knowledge.models import KnowledgeChunk, KnowledgeSource

pytestmark = pytest.mark.django_db


def test_the_demo_knowledge_base_is_the_one_the_readme_describes():
    demo.seed(stdout=StringIO())
    workspace = demo.demo_workspace()
    sources = KnowledgeSource.objects.filter(workspace=workspace)
    assert {source.ingest_status for source in sources} == {"indexed"}
    said = re.search(r"knowledge base \((\d+) documents, ([\d,]+) chunks\)", (BASE_DIR / "README.md").read_text())
    assert said, "the README no longer says how big the demo knowledge base is"
    assert (int(said[1]), int(said[2].replace(",", ""))) == \
        (sources.count(), KnowledgeChunk.objects.filter(workspace=workspace).count())
