"""Tools installed one by one: which optional model-facing tools a session's host offers it."""

from .. import events as ev
from .. import limits
from ..commands import INSTALLABLE_TOOLS, InstallTools
from ..errors import LifecycleError
from .lifecycle import Given, require_registered

UNKNOWN_NAMED = 5


def decide_install_tools(command: InstallTools, given: Given) -> list[ev.Event]:
    require_registered(given.state)
    unknown = [name for name in command.tools if name not in INSTALLABLE_TOOLS]
    if unknown:
        # Named bounded, and a few of them: a host's list of 15 names of a megabyte each is not echoed back.
        named = ", ".join(limits.shown(name) for name in unknown[:UNKNOWN_NAMED])
        more = f" and {len(unknown) - UNKNOWN_NAMED} more" if len(unknown) > UNKNOWN_NAMED else ""
        raise LifecycleError("lifecycle:unknown_tool",
                             f"no installable tool named {named}{more}; one of {', '.join(INSTALLABLE_TOOLS)}")
    # In the table's order, once each: installing is a set, and the same set again changes nothing.
    tools = tuple(name for name in INSTALLABLE_TOOLS if name in command.tools)
    if tools == given.state.installed_tools:
        return []
    return [ev.ToolsInstalled(at=given.now, tools=list(tools))]
