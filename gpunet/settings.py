"""Settings the way every long-running gpunet command reads them: a flag, else a GPUNET_<FLAG>
environment variable, else a key of the --config YAML file, else the default; one name for
each setting everywhere. The exporter (exporter/settings.py) and the diagnoser service
(diagnoser/service/settings.py) build their parsers and hand them to `layered_defaults`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")

# GPUNET_* variables of the project's tools that read them themselves, which may share an
# environment with any of them (the systemd unit's environment file sets GPUNET_EXPORTER_OPTS):
# not the command's settings, and no mistake either. Any other GPUNET_* variable that names no
# setting is refused.
OTHER_TOOLS_VARIABLES = frozenset({
    "GPUNET_EXPORTER_OPTS",  # deploy/systemd: the exporter's flags, expanded into its command line
    "GPUNET_PROMETHEUS_URL", "GPUNET_PROMETHEUS_PASSWORD", "GPUNET_GRAFANA_URL",  # diagnose, gpunet-trace
    "GPUNET_SLURM_DIR", "GPUNET_GPU_IDS",  # deploy/slurm: the prolog and epilog
})


def as_bool(value: object) -> bool:
    """A switch from a config file or an environment variable; anything else is a ValueError
    (GPUNET_NO_GPU=maybe is a mistake to report, not a "no")."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in TRUE + FALSE:
        raise ValueError(f"{value!r} is not a switch (true/false, 1/0, yes/no, on/off)")
    return text in TRUE


def env_name(flag: str) -> str:
    """--web.config.file -> GPUNET_WEB_CONFIG_FILE"""
    return "GPUNET_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def nearest(name: str, names: list[str]) -> str | None:
    """The valid name nearest a misspelt one, if any is near."""
    import difflib  # only for a mistake: a running command does not load it

    close = difflib.get_close_matches(name, names, n=1)
    return close[0] if close else None


def unknown_variable(variable: str, known: list[str]) -> str | None:
    """The complaint about a GPUNET_* environment variable that names no setting (`known`: the
    variables that do); None for one that does, or that another tool reads."""
    if not variable.startswith("GPUNET_") or variable in known or variable in OTHER_TOOLS_VARIABLES:
        return None
    # Compared without the prefix all share, upper case as the variables are written.
    near = nearest(variable[len("GPUNET_"):].upper(), [v[len("GPUNET_"):] for v in known])
    return f"unknown setting {variable} (environment variable)" + (f"; did you mean GPUNET_{near}?" if near else "")


def listen_address(default_port: int) -> Callable[[str], tuple[str, int]]:
    """An argparse type for --listen [HOST]:PORT -> (host, port); an empty host is every address."""
    def parse(text: str) -> tuple[str, int]:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"--listen {text!r}: expected [HOST]:PORT with a port 1-65535, "
                                             f"e.g. :{default_port}")
        return host.strip("[]") or "0.0.0.0", int(port)
    return parse


def layered_defaults(parser: argparse.ArgumentParser, argv: list[str] | None,
                     variable_problem: Callable[[str, list[str]], str | None] = unknown_variable,
                     key_problem: Callable[[str], str | None] = lambda key: None) -> None:
    """Set the parser's defaults from the --config file (or GPUNET_CONFIG) and the GPUNET_*
    variables, each value checked by the flag's own type; a mistake is parser.error (exit 2,
    one line naming the setting and where it came from). `variable_problem` and
    `key_problem` let a command refuse its own kinds of names (the exporter's collectors)."""
    first, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    settings: dict[str, object] = {}
    config_path = getattr(first, "config", None) or os.environ.get("GPUNET_CONFIG")
    if config_path:
        import yaml  # only with a settings file: a command without one does not load it

        try:
            with open(config_path, encoding="utf-8") as f:
                loaded = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            parser.error(f"--config {config_path}: {' '.join(str(e).split())}")
        if not isinstance(loaded, dict):
            parser.error(f"--config {config_path}: expected a mapping of flag names to values")
        settings.update({str(k): v for k, v in loaded.items()})
    by_flag = {opt.lstrip("-"): action for action in parser._actions for opt in action.option_strings
               if opt.startswith("--")}
    keys = [flag for flag in by_flag if flag not in ("config", "help", "version")]  # what a setting may be named
    variables = ["GPUNET_CONFIG", *map(env_name, keys)]
    for variable in sorted(os.environ):
        if problem := variable_problem(variable, variables):
            parser.error(problem)
    for flag, action in by_flag.items():
        if env_name(flag) in os.environ:
            value = os.environ[env_name(flag)]
            settings[flag] = value.split(",") if isinstance(action, argparse._AppendAction) else value
    defaults = {}
    for key, value in settings.items():
        action = by_flag.get(key)
        if action is None and (problem := key_problem(key)):
            parser.error(f"setting {problem} (in --config or GPUNET_* variables)")
        if action is None or key in ("config", "help", "version"):
            near = nearest(key, keys)
            parser.error(f"unknown setting {key!r} (in --config or GPUNET_* variables)"
                         + (f"; did you mean {near!r}?" if near else ""))
        try:
            if isinstance(action, argparse._StoreTrueAction):
                value = as_bool(value)
            elif isinstance(action, argparse.BooleanOptionalAction):
                value = not as_bool(value) if key.startswith("no-") else as_bool(value)  # no-collector.NAME
            elif isinstance(action, argparse._AppendAction):
                values = value if isinstance(value, list) else [value]
                value = [action.type(str(v)) if action.type else v for v in values]
            elif action.type is not None:
                value = action.type(str(value))
            elif action.choices is not None and value not in action.choices:
                raise ValueError(f"{value!r} is not one of {', '.join(map(str, action.choices))}")
        except (argparse.ArgumentTypeError, ValueError) as e:
            parser.error(f"setting {key} ({env_name(key)} or --config): {e}")
        defaults[action.dest] = value
    parser.set_defaults(**defaults)

