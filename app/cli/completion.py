"""``arbiter completion bash|zsh|fish``: a completion script written from the parser itself, so
it knows every command, option and choice this version has, and runs no Python at a TAB.

Written here rather than with a package: shtab writes bash and zsh but not fish, and argcomplete
runs the program at every TAB (and wants a global hook). Each script walks the words typed so
far the same way: a word that names a subcommand of where it is goes one level down, an option
that takes a value skips that value."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

SHELLS = ("bash", "zsh", "fish")
FILE_METAVAR = "FILE"


@dataclass
class Node:
    """One command level: its subcommands, options, and the choices of its positional argument."""

    commands: list[tuple[str, str]] = field(default_factory=list)
    options: list[tuple[str, str, list[str] | None, bool]] = field(default_factory=list)  # flag, help, values, file
    flags: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)


def add_parser(sub: Any, root: argparse.ArgumentParser) -> None:
    completion = sub.add_parser("completion", help="print a shell completion script (docs/cli.md sets it up)")
    completion.add_argument("shell", choices=SHELLS)
    completion.set_defaults(run=lambda args: print(script(root, args.shell), end="") or 0)


def script(root: argparse.ArgumentParser, shell: str) -> str:
    nodes = dict(_walk(root, ""))
    return {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell](nodes)


def _walk(parser: argparse.ArgumentParser, path: str) -> Any:
    node = Node()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                node.commands.append((name, helps.get(name, "")))
                yield from _walk(child, f"{path} {name}".strip())
        elif action.option_strings and action.help != argparse.SUPPRESS:
            takes_value = action.nargs != 0
            values = ([str(c) for c in action.choices] if action.choices else []) if takes_value else None
            for flag in (f for f in action.option_strings if f.startswith("--")):
                node.flags.append(flag)
                node.options.append((flag, action.help or "", values, takes_value and action.metavar == FILE_METAVAR))
        elif action.choices:
            node.values += [str(c) for c in action.choices]
    yield path, node


def _valued(node: Node) -> list[str]:
    return [flag for flag, _, values, _ in node.options if values is not None]


def _files(nodes: dict[str, Node]) -> list[str]:
    return sorted({flag for n in nodes.values() for flag, _, _, file in n.options if file})


def _cases(nodes: dict[str, Node], words: Any, indent: str = "        ") -> str:
    """``case`` arms (bash and zsh alike): the path, then what ``words(node)`` gives, space-separated."""
    return "\n".join(f'{indent}"{path}") echo "{" ".join(words(node))}" ;;' for path, node in nodes.items()
                     if words(node))


def _value_cases(nodes: dict[str, Node], indent: str = "        ") -> str:
    arms = [f'{indent}"{path}|{flag}") echo "{" ".join(values)}" ;;' for path, node in nodes.items()
            for flag, _, values, _ in node.options if values]
    arms += [f'{indent}"{path}|") echo "{" ".join(node.values)}" ;;' for path, node in nodes.items() if node.values]
    return "\n".join(arms)


_WALK = """    for ((i = {first}; i < {current}; i++)); do
        word="${{{words}[i]}}"
        if ((skip)); then skip=0; continue; fi
        if [[ $word == -* ]]; then
            [[ $word != *=* && " $(_arbiter_valued "$cmdpath") " == *" $word "* ]] && skip=1
        elif [[ " $(_arbiter_commands "$cmdpath") " == *" $word "* ]]; then
            cmdpath="${{cmdpath:+$cmdpath }}$word"
        fi
    done"""


def _shared_functions(nodes: dict[str, Node]) -> str:
    return f"""_arbiter_commands() {{
    case "$1" in
{_cases(nodes, lambda n: [c for c, _ in n.commands])}
    esac
}}
_arbiter_options() {{
    case "$1" in
{_cases(nodes, lambda n: n.flags)}
    esac
}}
_arbiter_valued() {{
    case "$1" in
{_cases(nodes, _valued)}
    esac
}}
_arbiter_values() {{
    case "$1|$2" in
{_value_cases(nodes)}
    esac
}}"""


def _bash(nodes: dict[str, Node]) -> str:
    return f"""# arbiter completion for bash: source <(arbiter completion bash)
{_shared_functions(nodes)}
_arbiter() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" cmdpath="" word i skip=0
{_WALK.format(first=1, current="COMP_CWORD", words="COMP_WORDS")}
    if ((skip)); then
        case "$prev" in
            {"|".join(_files(nodes))}) COMPREPLY=($(compgen -f -- "$cur")) ;;
            *) COMPREPLY=($(compgen -W "$(_arbiter_values "$cmdpath" "$prev")" -- "$cur")) ;;
        esac
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_arbiter_options "$cmdpath")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_arbiter_commands "$cmdpath") $(_arbiter_values "$cmdpath" "")" -- "$cur"))
    fi
}}
complete -F _arbiter arbiter
"""


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh(nodes: dict[str, Node]) -> str:
    def described(entries: list[tuple[str, str]]) -> str:
        return " ".join(_zsh_quote(name + ":" + help_.replace(":", "\\:")) for name, help_ in entries)

    commands = "\n".join(f'        "{p}") reply=({described(n.commands)}) ;;' for p, n in nodes.items() if n.commands)
    options = "\n".join(f'        "{p}") reply=({described([(f, h) for f, h, _, _ in n.options])}) ;;'
                        for p, n in nodes.items() if n.options)
    return f"""#compdef arbiter
# arbiter completion for zsh: arbiter completion zsh > "${{fpath[1]}}/_arbiter" (or source it)
{_shared_functions(nodes)}
_arbiter_described_commands() {{
    reply=()
    case "$1" in
{commands}
    esac
}}
_arbiter_described_options() {{
    reply=()
    case "$1" in
{options}
    esac
}}
_arbiter() {{
    local cur="${{words[CURRENT]}}" prev="${{words[CURRENT-1]}}" cmdpath="" word i skip=0
    local -a reply values
{_WALK.format(first=2, current="CURRENT", words="words")}
    if ((skip)); then
        case "$prev" in
            {"|".join(_files(nodes))}) _files ;;
            *) values=(${{=$(_arbiter_values "$cmdpath" "$prev")}}); (( $#values )) && compadd -- $values ;;
        esac
    elif [[ $cur == -* ]]; then
        _arbiter_described_options "$cmdpath"
        (( $#reply )) && _describe -t options option reply
    else
        _arbiter_described_commands "$cmdpath"
        (( $#reply )) && _describe -t commands command reply
        values=(${{=$(_arbiter_values "$cmdpath" "")}})
        (( $#values )) && compadd -- $values
    fi
    return 0
}}
if [[ ${{zsh_eval_context[-1]}} == loadautofunc ]]; then
    _arbiter "$@"
else
    compdef _arbiter arbiter
fi
"""


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(nodes: dict[str, Node]) -> str:
    def switch(words: Any) -> str:
        return "\n".join(f"        case {_fish_quote(p)}\n            printf '%s\\n' {' '.join(words(n))}"
                         for p, n in nodes.items() if words(n))

    lines = []
    for path, node in nodes.items():
        at = f"-n {_fish_quote(f'__arbiter_at {_fish_quote(path)}')}"
        lines += [f"complete -c arbiter {at} -a {_fish_quote(name)} -d {_fish_quote(help_)}"
                  for name, help_ in node.commands]
        if node.values:
            lines.append(f"complete -c arbiter {at} -a {_fish_quote(' '.join(node.values))}")
        for flag, help_, values, file in node.options:
            takes = "" if values is None else (" -r -F" if file else " -x" + (
                f" -a {_fish_quote(' '.join(values))}" if values else ""))
            lines.append(f"complete -c arbiter {at} -l {flag[2:]}{takes} -d {_fish_quote(help_)}")
    return f"""# arbiter completion for fish: arbiter completion fish > ~/.config/fish/completions/arbiter.fish
function __arbiter_commands
    switch "$argv[1]"
{switch(lambda n: [c for c, _ in n.commands])}
    end
end
function __arbiter_valued
    switch "$argv[1]"
{switch(_valued)}
    end
end
function __arbiter_path
    set -l words (commandline -opc)
    set -e words[1]
    set -l cmdpath ''
    set -l skip 0
    for word in $words
        if test $skip -eq 1
            set skip 0
        else if string match -q -- '-*' $word
            if not string match -q -- '*=*' $word; and contains -- $word (__arbiter_valued $cmdpath)
                set skip 1
            end
        else if contains -- $word (__arbiter_commands $cmdpath)
            set cmdpath (string trim -- "$cmdpath $word")
        end
    end
    echo $cmdpath
end
function __arbiter_at
    set -l here (__arbiter_path)
    test "$here" = "$argv[1]"
end
complete -c arbiter -f
{chr(10).join(lines)}
"""
