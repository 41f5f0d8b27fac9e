"""The commit script's arguments are laid out in one Python module (``commitargs``) and read in one place at the
top of ``commit.lua``: the two name the same sections in the same order, and the header says where each lands."""

import re

from treemail.adapters.commitargs import CompanionSections, Sections, lay_out
from treemail.adapters.eventstore import COMMIT_LUA


def lua_names(table: str) -> tuple[str, ...]:
    body = re.search(rf"local {table} = \{{(.*?)\}}", COMMIT_LUA, re.S).group(1)
    return tuple(re.findall(r"'(\w+)'", body))


def test_the_script_reads_the_sections_python_lays_out_in_the_same_order():
    assert lua_names("SECTIONS") == Sections._fields
    assert lua_names("COMPANION_SECTIONS") == CompanionSections._fields


def test_the_script_reads_its_arguments_only_through_the_header():
    after_header = COMMIT_LUA.split("local at = sections(ARGV[1], SECTIONS)", 1)[1]
    assert re.findall(r"ARGV\[\d", after_header) == []
    assert "#ARGV" not in COMMIT_LUA


def companion(name: str, events: int) -> CompanionSections:
    return CompanionSections(etags=(f"{name}0 {name}1",), snapshot=("{}",), session=(name,), feed_name=(name,),
                             events=(events, *["t", "d"] * events), outbound=(0,), mail=(0,), wakes=(0,),
                             due=("", ""))


def sections_with(companions: list[CompanionSections], events: int = 1) -> Sections:
    singles = {name: (f"<{name}>",) for name in Sections._fields}
    return Sections(**{**singles, "events": (events, *["t", "d"] * events), "mail": (0,), "wakes": (0,),
                       "approvals": (0,), "grants": (0,), "due": ("set", "1.5"), "outbound": (0,),
                       "answer": ("", "", "", ""), "companions": companions})


def test_each_header_position_is_where_its_section_begins():
    sections = sections_with([companion("c-1", 2), companion("c-2", 0)], events=3)
    args = lay_out(sections)
    argv = [None, *args]  # 1-based, as the script reads it
    at = dict(zip(Sections._fields, map(int, argv[1].split())))

    for name, section in zip(Sections._fields[:-1], sections[:-1]):
        assert argv[at[name]:at[name] + len(section)] == list(section), name
    assert argv[at["companions"]] == 2
    for n, expected in enumerate(sections.companions, start=1):
        cat = dict(zip(CompanionSections._fields, map(int, argv[at["companions"] + n].split())))
        for name, section in zip(CompanionSections._fields, expected):
            assert argv[cat[name]:cat[name] + len(section)] == list(section), (n, name)
    assert len(args) == 1 + sum(map(len, sections[:-1])) + 1 + 2 + sum(len(s) for c in sections.companions for s in c)
