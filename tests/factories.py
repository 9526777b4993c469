import factory
from django.contrib.auth import get_user_model

from workspaces.models import Membership, Workspace


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.test")
    password = factory.django.Password("correct horse battery staple")


class WorkspaceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workspace

    name = factory.Sequence(lambda n: f"Workspace {n}")
    slug = factory.Sequence(lambda n: f"workspace-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    workspace = factory.SubFactory(WorkspaceFactory)
    role = Membership.Role.MEMBER


# ---- knowledge ----


def _embedding_model() -> str:
    from django.conf import settings

    return settings.EMBEDDING_MODEL


def _embed(text: str):
    from llm.embeddings import get_embedding_provider

    return get_embedding_provider().embed_query(text)


class KnowledgeSourceFactory(factory.django.DjangoModelFactory):
    """An indexed text source without chunks; add chunks with KnowledgeChunkFactory."""

    class Meta:
        model = "knowledge.KnowledgeSource"

    workspace = factory.SubFactory(WorkspaceFactory)
    title = factory.Sequence(lambda n: f"Source {n}")
    kind = "text"
    text = factory.LazyAttribute(lambda o: f"Text of {o.title}.")
    ingest_status = "indexed"
    embedding_model = factory.LazyFunction(_embedding_model)


class KnowledgeChunkFactory(factory.django.DjangoModelFactory):
    """A chunk embedded with the configured (offline, in tests) provider."""

    class Meta:
        model = "knowledge.KnowledgeChunk"

    source = factory.SubFactory(KnowledgeSourceFactory)
    workspace = factory.LazyAttribute(lambda o: o.source.workspace)
    ordinal = factory.Sequence(lambda n: n)
    content = factory.Sequence(lambda n: f"Chunk number {n} about durable workflows.")
    token_count = factory.LazyAttribute(lambda o: len(o.content) // 4)
    embedding = factory.LazyAttribute(lambda o: _embed(o.content))


class SkillFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "knowledge.Skill"

    workspace = factory.SubFactory(WorkspaceFactory)
    name = factory.Sequence(lambda n: f"skill-{n}")
    version = 1
    description = "Summarize meeting notes into decisions and action items."
    content_md = "# Skill\n\nDo the thing well."
    triggers = factory.LazyFunction(lambda: ["meeting"])
    active = True
    content_hash = factory.Sequence(lambda n: f"{n:064x}")
    origin = "seed"
