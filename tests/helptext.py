"""Reading the CLI's own `--help` text: the commands it lists and the options it shows (used by the docs' and the
help's tests, so that what they compare against is what a user reads, not what a generator walked)."""
import re


def help_of(cli, *path: str) -> str:
    code, out, err = cli(*path, "--help")
    assert code == 0, err
    return out


def command_paths(cli, *path: str) -> list[tuple[str, ...]]:
    """Every command path `--help` lists, read from the help text itself, groups' commands included."""
    text = help_of(cli, *path)
    if "Commands:" not in text:
        return []
    names = re.findall(r"^  ([a-z][\w-]*)\s", text.split("Commands:", 1)[1], re.M)
    found: list[tuple[str, ...]] = []
    for name in names:
        found.append((*path, name))
        found += command_paths(cli, *path, name)
    return found


def options_of(help_text: str) -> set[str]:
    """The option names in the Options section's first column (not those the help sentences mention)."""
    section = help_text.split("Options:", 1)[1] if "Options:" in help_text else ""
    section = section.split("Commands:", 1)[0]
    column = [line.split("  ", 2)[1] for line in section.splitlines()
              if line.startswith("  ") and len(line.split("  ", 2)) > 1]
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", "\n".join(column)))
