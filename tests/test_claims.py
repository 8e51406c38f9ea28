"""The claims ledger (book/claims.yml) is well formed, cites real works and links to real sections.

Appendix A renders this file; these checks keep it an instrument a reader can trust: every claim
names the works that make it (keys of book/references.bib), links to the labelled section of the
chapter that measures it, and a verdict that rests on training has enough seeds behind it. A
property that holds by construction is a check, not a claim; and a claim tested in several chapters
has one verdict: its rows link to one primary row (``same_claim_as``), which says in one line how
their numbers fit it (``reconciled``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

BOOK = Path(__file__).resolve().parents[1] / "book"
VERDICTS = ("holds", "holds partly", "does not hold at this scale", "not testable at this scale")
CLAIM_FIELDS = {"chapter", "claim", "sources", "ref", "verdict", "scale", "seeds", "note"}
CLAIM_OPTIONAL = {"at_scale", "same_claim_as", "reconciled"}
AT_SCALE_FIELDS = {"scale", "device", "verdict", "note"}  # a recorded larger run that changes the verdict
CHECK_FIELDS = {"chapter", "check", "sources", "ref", "note"}
MIN_SEEDS_FOR_HOLDS = 3
# With 1-2 seeds a training verdict can only be tentative; both firm verdicts need MIN_SEEDS_FOR_HOLDS.
FIRM_VERDICTS = ("holds", "does not hold at this scale")
# A note that says this describes a property of the method, not a finding: the row belongs in `checks`.
BY_CONSTRUCTION = re.compile(r"by construction|\bidentit(y|ies)\b", flags=re.IGNORECASE)
MAX_RECONCILED = 300  # characters: one line of the rendered table


def bib_keys(text: str) -> set[str]:
    return set(re.findall(r"^@\w+\{([^,\s]+),", text, flags=re.MULTILINE))


def notebook_labels(path: Path) -> set[str]:
    """MyST targets ``(label)=`` on their own line in the notebook's markdown cells."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return set(re.findall(r"^\(([\w-]+)\)=\s*$", text, flags=re.MULTILINE))


def recorded_runs() -> dict[tuple[int, str], dict[str, str]]:
    """``(scale, device) -> {notebook: status}`` of the runs in book/results/scale/."""
    runs = {}
    for path in sorted((BOOK / "results" / "scale").glob("scale-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        runs[(data["meta"]["scale"], data["meta"]["device"])] = {k: v["status"] for k, v in data["notebooks"].items()}
    return runs


def at_scale_problems(where: str, entry: dict, runs: dict[tuple[int, str], dict[str, str]]) -> list[str]:
    """An ``at_scale`` list: each item a recorded run (scale > 1) of the chapter that ran to the end."""
    items = entry["at_scale"]
    if not isinstance(items, list) or not items:
        return [f"{where}: at_scale must be a non-empty list"]
    problems = []
    for item in items:
        if not isinstance(item, dict) or set(item) != AT_SCALE_FIELDS:
            problems.append(f"{where}: at_scale items need exactly {sorted(AT_SCALE_FIELDS)}, got {item!r}")
            continue
        if item["verdict"] not in VERDICTS:
            problems.append(f"{where}: at_scale verdict {item['verdict']!r} not in {VERDICTS}")
        status = runs.get((item["scale"], item["device"]), {}).get(entry["chapter"])
        if status != "ok":
            problems.append(f"{where}: no recorded run of {entry['chapter']} at SCALE {item['scale']} on "
                            f"{item['device']} that ran to the end (book/results/scale/; got {status!r})")
    return problems


def link_problems(claims: list[dict]) -> list[str]:
    """Rows that test the same claim: each names the ref of one primary row, which carries
    ``reconciled``, a line that fits their numbers to the one verdict they all carry."""
    def where(entry):
        return f"claim at {entry.get('ref')} ({str(entry.get('claim'))[:50]})"

    problems = []
    by_ref: dict[str, list[dict]] = {}
    for entry in claims:
        by_ref.setdefault(entry.get("ref"), []).append(entry)
    linked_to: dict[int, list[dict]] = {}  # id(primary) -> the rows that name it
    for entry in claims:
        if "same_claim_as" not in entry:
            continue
        target = entry["same_claim_as"]
        if "reconciled" in entry:
            problems.append(f"{where(entry)}: a primary row (with reconciled) cannot also have same_claim_as; "
                            "link every row to one primary")
            continue
        if not isinstance(target, str) or target not in by_ref:
            problems.append(f"{where(entry)}: same_claim_as {target!r}: no claim at that ref")
            continue
        if target == entry["ref"]:
            problems.append(f"{where(entry)}: same_claim_as names its own ref; a row that restates another of "
                            "its section belongs in checks")
            continue
        primaries = [e for e in by_ref[target] if "reconciled" in e]
        if len(primaries) != 1:
            problems.append(f"{where(entry)}: same_claim_as {target!r} needs exactly one row there with reconciled "
                            f"(the primary), found {len(primaries)}")
            continue
        primary = primaries[0]
        linked_to.setdefault(id(primary), []).append(entry)
        if entry["verdict"] != primary["verdict"]:
            problems.append(f"{where(entry)}: one claim, one verdict: {entry['verdict']!r} here, "
                            f"{primary['verdict']!r} at {target}")
    for entry in claims:
        if "reconciled" not in entry or "same_claim_as" in entry:  # the latter reported above
            continue
        line = entry["reconciled"]
        if not isinstance(line, str) or not line.strip() or "\n" in line.strip() or len(line) > MAX_RECONCILED:
            problems.append(f"{where(entry)}: reconciled must be one line of at most {MAX_RECONCILED} characters")
        if id(entry) not in linked_to:
            problems.append(f"{where(entry)}: reconciled, but no row names {entry['ref']!r} in same_claim_as")
    return problems


def ledger_problems(ledger: dict, keys: set[str], labels: dict[str, set[str]],
                    runs: dict[tuple[int, str], dict[str, str]] | None = None) -> list[str]:
    """Every problem of a parsed ledger, as readable lines (empty when it is sound)."""
    problems = []
    if set(ledger) != {"claims", "checks"}:
        return [f"the ledger must have exactly the sections 'claims' and 'checks', got {sorted(ledger)}"]
    for section, fields in (("claims", CLAIM_FIELDS), ("checks", CHECK_FIELDS)):
        for i, entry in enumerate(ledger[section]):
            where = f"{section}[{i}] ({entry.get('chapter')}: {str(entry.get('claim', entry.get('check')))[:50]})"
            optional = CLAIM_OPTIONAL if section == "claims" else set()
            if not fields <= set(entry) <= fields | optional:
                problems.append(f"{where}: fields {sorted(entry)}, expected {sorted(fields)}"
                                + (f" (optional: {sorted(optional)})" if optional else ""))
                continue
            if "at_scale" in entry:
                problems += at_scale_problems(where, entry, runs or {})
            if entry["chapter"] not in labels:
                problems.append(f"{where}: no notebook book/{entry['chapter']}.ipynb")
            elif entry["ref"] not in labels[entry["chapter"]]:
                problems.append(f"{where}: label ({entry['ref']})= not found in book/{entry['chapter']}.ipynb")
            sources = entry["sources"]
            if not isinstance(sources, list) or not sources:
                problems.append(f"{where}: sources must be a non-empty list of bib keys")
            else:
                problems += [f"{where}: unknown bib key {key!r}" for key in sources if key not in keys]
            if section == "claims":
                verdict, seeds = entry["verdict"], entry["seeds"]
                if verdict not in VERDICTS:
                    problems.append(f"{where}: verdict {verdict!r} not in {VERDICTS}")
                if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 0:
                    problems.append(f"{where}: seeds must be an int >= 0, got {seeds!r}")
                elif 0 < seeds < MIN_SEEDS_FOR_HOLDS and verdict in FIRM_VERDICTS:
                    problems.append(f"{where}: {verdict!r} on {seeds} seed(s); training verdicts need "
                                    f"{MIN_SEEDS_FOR_HOLDS} (else 'holds partly' or 'not testable at this scale')")
                if not str(entry["scale"]).strip():
                    problems.append(f"{where}: say the scale it was measured at")
                found = BY_CONSTRUCTION.search(str(entry["note"]))
                if found:
                    problems.append(f"{where}: the note says {found.group(0)!r}: a property by construction is "
                                    "a check, not a claim (move it to checks)")
    if not problems:  # links are checked on well-formed rows
        problems += link_problems(ledger["claims"])
    return problems


@pytest.fixture(scope="module")
def ledger() -> dict:
    return yaml.safe_load((BOOK / "claims.yml").read_text(encoding="utf-8"))


def test_the_ledger_is_sound(ledger):
    keys = bib_keys((BOOK / "references.bib").read_text(encoding="utf-8"))
    labels = {p.stem: notebook_labels(p) for p in BOOK.glob("*.ipynb")}
    assert ledger_problems(ledger, keys, labels, recorded_runs()) == []


def test_every_chapter_with_a_claim_is_in_the_book(ledger):
    toc = (BOOK.parent / "_toc.yml").read_text(encoding="utf-8")
    chapters = {e["chapter"] for e in ledger["claims"] + ledger["checks"]}
    assert {c for c in chapters if f"book/{c}" not in toc} == set()


def test_bib_entries_have_an_identifier():
    """Each work can be found: a DOI, an arXiv id or a URL."""
    text = (BOOK / "references.bib").read_text(encoding="utf-8")
    entries = re.findall(r"^@\w+\{([^,\s]+),(.*?)^\}", text, flags=re.MULTILINE | re.DOTALL)
    missing = [key for key, body in entries if not re.search(r"^\s*(doi|eprint|url)\s*=", body, re.MULTILINE)]
    assert len(entries) == len(bib_keys(text))
    assert missing == [], f"entries without doi, eprint or url: {missing}"


def test_the_checks_can_fail():
    """The validator rejects each kind of defect it is meant to catch."""
    good = {"chapter": "c", "claim": "x", "sources": ["k"], "ref": "lbl", "verdict": "holds", "scale": "toy",
            "seeds": 3, "note": "n"}
    labels, keys = {"c": {"lbl"}}, {"k"}
    assert ledger_problems({"claims": [good], "checks": []}, keys, labels) == []
    for change, message in [
        ({"sources": ["nope"]}, "unknown bib key"),
        ({"sources": []}, "non-empty list"),
        ({"ref": "missing"}, "not found"),
        ({"chapter": "other"}, "no notebook"),
        ({"verdict": "true"}, "not in"),
        ({"seeds": 1}, "'holds' on 1 seed"),
        ({"seeds": 2, "verdict": "does not hold at this scale"}, "'does not hold at this scale' on 2 seed"),
        ({"scale": " "}, "scale"),
        ({"note": "exact by construction of the mask"}, "by construction"),
        ({"note": "an identity of the softmax"}, "by construction"),
    ]:
        problems = ledger_problems({"claims": [{**good, **change}], "checks": []}, keys, labels)
        assert len(problems) == 1 and message in problems[0], (change, problems)
    for verdict in ("holds partly", "not testable at this scale"):  # tentative verdicts on 1 seed are fine
        assert ledger_problems({"claims": [{**good, "seeds": 1, "verdict": verdict}], "checks": []}, keys,
                               labels) == []
    assert ledger_problems({"claims": [{**good, "seeds": 0, "verdict": "does not hold at this scale"}],
                            "checks": []}, keys, labels) == []  # nothing trained: no seeds needed
    assert "fields" in ledger_problems({"claims": [{**good, "seed": "000 §1"}], "checks": []}, keys, labels)[0]
    # a verdict changed by a larger run needs that run recorded, and ran to the end
    changed = {**good, "at_scale": [{"scale": 2, "device": "cpu", "verdict": "holds partly", "note": "n"}]}
    runs = {(2, "cpu"): {"c": "ok"}}
    assert ledger_problems({"claims": [changed], "checks": []}, keys, labels, runs) == []
    for runs_, item_change, message in [
        ({}, {}, "no recorded run"),
        ({(2, "cpu"): {"c": "AssertionError"}}, {}, "no recorded run"),
        (runs, {"verdict": "maybe"}, "not in"),
        (runs, {"seeds": 3}, "need exactly"),
    ]:
        item = {**changed["at_scale"][0], **item_change}
        problems = ledger_problems({"claims": [{**changed, "at_scale": [item]}], "checks": []}, keys, labels, runs_)
        assert len(problems) == 1 and message in problems[0], (item_change, problems)


def test_the_link_checks_can_fail():
    """Rows of one claim link to one existing primary, share its verdict, and the primary reconciles them."""
    row = {"chapter": "c", "claim": "x", "sources": ["k"], "verdict": "holds partly", "scale": "toy", "seeds": 3,
           "note": "n"}
    labels, keys = {"c": {"a", "b", "c"}}, {"k"}
    primary = {**row, "ref": "a", "reconciled": "one verdict: both chapters agree"}
    linked = {**row, "ref": "b", "same_claim_as": "a"}
    other = {**row, "ref": "c"}

    def problems(*rows):
        return ledger_problems({"claims": list(rows), "checks": []}, keys, labels)

    assert problems(primary, linked, other) == []
    assert problems(primary, linked, {**linked, "ref": "c"}) == []  # several rows may name one primary
    # two primaries at different refs of the same section are told apart by the ref
    assert problems(primary, linked, {**other, "reconciled": "r"}, {**other, "ref": "b", "same_claim_as": "c"}) == []
    for rows, message in [
        ((primary, linked, {**other, "same_claim_as": "nowhere"}), "no claim at that ref"),
        ((primary, linked, other, {**linked, "same_claim_as": "c"}), "exactly one row there with reconciled"),
        ((primary, linked, {**linked, "ref": "c", "reconciled": "r"}), "cannot also have same_claim_as"),
        ((primary, linked, {**linked, "same_claim_as": "b"}), "its own ref"),
        ((primary, {**linked, "verdict": "holds"}), "one claim, one verdict"),
        ((primary, other), "no row names 'a'"),
        (({**primary, "reconciled": " "}, linked), "one line"),
        (({**primary, "reconciled": "x" * (MAX_RECONCILED + 1)}, linked), "one line"),
    ]:
        found = problems(*rows)
        assert len(found) == 1 and message in found[0], (rows, found)
    # two primaries at one ref: a link to it cannot tell which is meant
    found = problems(primary, {**primary, "claim": "y"}, linked)
    assert any("found 2" in p for p in found), found
