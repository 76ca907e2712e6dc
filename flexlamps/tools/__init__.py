"""Tools an agent request calls: code run in a sandboxed subprocess (`sandbox`)."""
