"""The diagnoser service (docs/service.md): `diagnose serve` runs the diagnosis on a schedule
and on Alertmanager's webhook, keeps the reports in a bounded SQLite history, publishes the
verdicts and findings as metrics and serves the reports; `diagnose history` reads the history."""
