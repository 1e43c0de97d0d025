"""Shell completion scripts (bash, zsh) written from the argparse parser, so they never fall behind the flags."""

from __future__ import annotations

import argparse

_FUNC = "_ddtree_chat"


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings]


def _is_dir(action: argparse.Action) -> bool:
    return action.metavar == "DIR"


def bash_script(parser: argparse.ArgumentParser) -> str:
    cases = []
    for a in _options(parser):
        if a.nargs == 0:
            continue
        names = "|".join(a.option_strings)
        if a.choices:
            reply = f'COMPREPLY=($(compgen -W "{" ".join(map(str, a.choices))}" -- "$cur"))'
        elif _is_dir(a):
            reply = 'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur"))'
        else:
            reply = "COMPREPLY=()"  # a free value (text, a number): nothing to offer
        cases.append(f"        {names}) {reply}; return ;;")
    words = " ".join(s for a in _options(parser) for s in a.option_strings)
    return "\n".join([
        f"# bash completion for {parser.prog}: eval \"$({parser.prog} --print-completion bash)\"",
        f"{_FUNC}() {{",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    case "$prev" in',
        *cases,
        "    esac",
        f'    COMPREPLY=($(compgen -W "{words}" -- "$cur"))',
        "}",
        f"complete -F {_FUNC} {parser.prog}",
    ])


def _zsh_quote(text: str) -> str:
    """Help text inside a single-quoted _arguments spec: no quotes, brackets or colons."""
    return (text or "").replace("'", "").replace("[", "(").replace("]", ")").replace(":", " -").replace("%%", "%")


def zsh_script(parser: argparse.ArgumentParser) -> str:
    specs = []
    for a in _options(parser):
        help_text = _zsh_quote(a.help if a.help != argparse.SUPPRESS else "")
        if a.nargs == 0:
            value = ""
        elif a.choices:
            value = f":{a.dest}:({' '.join(map(str, a.choices))})"
        elif _is_dir(a):
            value = f":{a.metavar}:_files -/"
        else:
            value = f":{(a.metavar or a.dest).lower()}: "
        specs += [f"  '{name}[{help_text}]{value}'" for name in a.option_strings]
    return "\n".join([f"#compdef {parser.prog}",
                      f"# zsh completion for {parser.prog}, after compinit: eval \"$({parser.prog} --print-completion zsh)\"",
                      f"{_FUNC}() {{", "  _arguments -s \\", " \\\n".join(specs), "}",
                      f"compdef {_FUNC} {parser.prog}"])


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    return {"bash": bash_script, "zsh": zsh_script}[shell](parser)
