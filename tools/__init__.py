"""Tools for the assistant: MCP servers as tool sources, who may call what, confirmation before a change,
exactly-once calls and the audit trail (issue 24)."""
