"""Lambda entry points: parse the event, call the core, return."""
