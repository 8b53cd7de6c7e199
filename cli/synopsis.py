"""The README's command list, generated from the CLI itself: `python -m pager.cli.synopsis`.

A test compares the README's "Commands" block with this, so a new command or option cannot
go unlisted."""

from __future__ import annotations


def _commands(command, path: tuple[str, ...] = ()):
    if hasattr(command, "commands"):   # a group: its subcommands, in name order
        for name in sorted(command.commands):
            yield from _commands(command.commands[name], (*path, name))
    elif not getattr(command, "hidden", False):
        yield path, command


METAVARS = {"home": "DIR", "db": "URI", "session": "S", "model": "M", "bookmark_model": "M", "memory_model": "M", "reranker": "M",
            "budget": "N",
            "policy": "P", "page_tokens": "N", "pages": "N", "conversations": "N", "questions": "N", "excerpts": "N", "step": "N", "rerank_pieces": "N", "rerank_facts": "N",
            "k": "N", "json_path": "OUT", "out": "OUT", "html": "OUT.html", "plot": "OUT.png", "keep": "DIR",
            "data": "FILE", "conversation": "ID", "format": "F", "host": "H", "port": "P", "tenant": "T",
            "key_id": "ID", "clients": "N", "shared": "N", "turns": "N", "alone_turns": "N", "earlier": "N",
            "max_body": "BYTES", "max_messages": "N", "max_append": "N", "timeout": "SECONDS", "idle": "SECONDS", "max_open": "N", "memory": "recorded|FILE",
            "sample_ids": "IDS", "api_base": "URL", "systems": "LIST", "tools_budget": "N", "tools_questions": "N", "tool_steps": "N",
            "output_tokens": "N", "cache": "FILE", "vector_cache": "FILE", "traces": "DIR", "paging": "MODE",
            "memory_delay": "SECONDS", "session_pages": "N,M", "repeat": "N"}


def _usage(param) -> str:
    if param.param_type_name == "argument":
        return param.name.upper()
    opt = max(param.opts, key=len)
    if param.is_flag:
        text = "/".join([opt, *param.secondary_opts]) if param.secondary_opts else opt
    else:
        text = f"{opt} {METAVARS.get(param.name, param.name.upper())}"
    if param.required:
        return text + ("..." if getattr(param, "multiple", False) else "")
    return f"[{text}]" + ("..." if getattr(param, "multiple", False) else "")


def synopsis() -> str:
    """One line per command with every argument and option, then its help's first sentence."""
    from typer.main import get_command

    from .app import app

    root = get_command(app)
    lines = ["pager " + " ".join(_usage(p) for p in root.params if p.name != "help") + " COMMAND"]
    for path, command in _commands(root):
        params = [_usage(p) for p in command.params if p.name != "help"]
        help_text = (command.help or "").strip().split("\n")[0]
        lines.append(" ".join(["pager", *path, *params]))
        lines.append("    " + help_text)
    return "\n".join(lines)


if __name__ == "__main__":
    print(synopsis())
