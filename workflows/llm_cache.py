"""The Postgres cache of identical chat calls (``LlmCall``), per workspace.

``llm.chat.chat(request, cache=ChatCache(workspace_id))`` asks it before calling a provider for a
temperature-0 request: a hit answers with the stored response and counts the hit; a miss stores
the response. Two workers making the same call at once both pay once and the first write wins
(the unique key); neither fails. ``LLM_CACHE_ENABLED = False`` turns it off.
"""

from __future__ import annotations

import json

from django.db import connection
from django.utils import timezone

from workflows.models import LlmCall


class ChatCache:
    def __init__(self, workspace_id: int):
        self.workspace_id = workspace_id

    def get(self, key: str) -> dict | None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {LlmCall._meta.db_table} SET hits = hits + 1, last_hit_at = %s "
                "WHERE workspace_id = %s AND key = %s RETURNING response::text",
                [timezone.now(), self.workspace_id, key],
            )
            row = cursor.fetchone()
        if row is None:
            return None
        return json.loads(row[0])

    def put(self, key: str, request, response) -> None:
        usage = response.usage
        LlmCall.objects.bulk_create([LlmCall(
            workspace_id=self.workspace_id, key=key, provider=usage.provider, model=usage.model,
            response=response.as_dict(), input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
            usd_cost=usage.usd_cost,
        )], ignore_conflicts=True)
