"""The commit script's arguments are laid out in one Python module (``commitargs``) and read in one place at the
top of ``commit.lua``: the two name the same sections in the same order, and the header says where each lands."""

import re

from treemail.adapters.commitargs import CompanionSections, Sections, lay_out, positions
from treemail.adapters.eventstore import COMMIT_LUA


def lua_names(prefix: str, header: str) -> tuple[str, ...]:
    """The locals the script unpacks ``header`` into (``local at_etags, at_snapshot, ... = struct.unpack(...)``),
    without their prefix."""
    names = re.search(rf"local ({prefix}_\w+(?:,\s*{prefix}_\w+)*)\s*=\s*struct\.unpack\([^\n]*?, {header}\)",
                      COMMIT_LUA).group(1)
    return tuple(name.strip().removeprefix(f"{prefix}_") for name in names.split(","))


def test_the_script_reads_the_sections_python_lays_out_in_the_same_order():
    assert lua_names("at", re.escape("ARGV[1]")) == Sections._fields
    assert lua_names("cat", r"ARGV\[at_companions \+ n\]") == CompanionSections._fields
    # The format strings unpack as many positions as there are names.
    assert f"string.rep('I4', {len(Sections._fields)}), ARGV[1])" in COMMIT_LUA
    assert f"COMPANION_HEADER = '<' .. string.rep('I4', {len(CompanionSections._fields)})" in COMMIT_LUA
    # The checks read a companion's etags as its header's first position.
    assert CompanionSections._fields[0] == "etags"


def test_the_script_reads_its_arguments_only_through_the_header():
    after_header = COMMIT_LUA.split("ARGV[1])", 1)[1]
    assert re.findall(r"ARGV\[\d", after_header) == []
    assert "#ARGV" not in COMMIT_LUA


def companion(name: str, events: int) -> CompanionSections:
    return CompanionSections(etags=f"{name}0 {name}1", snapshot="{}", session=name, feed_name=name.encode(),
                             due_op="", due_at="", events=(events, *["t", "d"] * events), outbound=(0,),
                             mail=(1, "m", "", ""), wakes=(1, "{}"))


def sections_with(companions: list[CompanionSections], events: int = 1) -> Sections:
    return Sections(
        etags="e0 e1", snapshot="{}", record="", record_field="", legacy_field="", registration="*",
        session="s-1", feed_name=b"~s-1", feed_maxlen=1000, due_op="set", due_at="1.5", answer="",
        answer_ttl="", command_group="", entry_id="", drain_read="0", protocol=1,
        events=(events, *["t", "d"] * events), mail=(0,), wakes=(0,), approvals=(1, "r", "v"), grants=(0,),
        outbound=(0,), companions=companions)


def section_at(argv: list, start: int, section) -> list:
    """The arguments from ``start`` as long as ``section`` (one argument, or a count and its items)."""
    length = len(section) if isinstance(section, tuple) else 1
    return argv[start:start + length]


def as_list(section) -> list:
    return list(section) if isinstance(section, tuple) else [section]


def test_each_header_position_is_where_its_section_begins():
    sections = sections_with([companion("c-1", 2), companion("c-2", 0)], events=3)
    args = lay_out(sections)
    argv = [None, *args]  # from 1, as the script reads it
    at = dict(zip(Sections._fields, positions(argv[1]), strict=True))

    for name, section in zip(Sections._fields[:-1], sections[:-1]):
        assert section_at(argv, at[name], section) == as_list(section), name
    assert argv[at["companions"]] == 2
    for n, expected in enumerate(sections.companions, start=1):
        cat = dict(zip(CompanionSections._fields, positions(argv[at["companions"] + n]), strict=True))
        for name, section in zip(CompanionSections._fields, expected):
            assert section_at(argv, cat[name], section) == as_list(section), (n, name)
    every = [*sections[:-1], *(s for c in sections.companions for s in c)]
    assert len(args) == 1 + 1 + 2 + sum(len(as_list(s)) for s in every)  # header, count, companion headers


def test_without_companions_their_section_is_a_zero_count_at_the_end():
    args = lay_out(sections_with([]))
    at = dict(zip(Sections._fields, positions(args[0]), strict=True))
    assert at["companions"] == len(args) and args[-1] == 0
