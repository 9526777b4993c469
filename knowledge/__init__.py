"""The knowledge base and the skill library: sources ingested into embedded, full-text indexed
chunks (ingestion is a durable workflow), vector / full-text / hybrid search, and versioned
Anthropic-style SKILL.md skills."""
