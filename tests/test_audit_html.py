"""`adjointgen audit --html`: self-contained pages whose structure a reader relies on."""
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.ids, self.links, self.maths, self.external = [], set(), [], 0, []
        self.text = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "math":
            self.maths += 1
        for key in ("href", "src"):
            value = attrs.get(key)
            if value is None:
                continue
            if value.startswith("#"):
                self.links.append(value[1:])
            elif re.match(r"^[a-z]+://|^//", value):
                self.external.append(value)

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def site(root, tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    r = subprocess.run([sys.executable, "-m", "adjointgen", "--root", str(root), "audit", "eigh", "--html", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def parse(path):
    page = Page()
    page.feed(path.read_text())
    return page


def test_page_is_self_contained_and_every_step_links_to_its_line(root, site):
    page = parse(site / "eigh.html")
    assert "script" not in page.tags and "link" not in page.tags and not page.external
    steps = [i for i in page.ids if i.startswith("step-")]
    assert len(steps) > 30
    lines = {i for i in page.ids if i.startswith("L")}
    assert len(lines) == len((root / "derivations" / "eigh.py").read_text().splitlines())  # the source, line by line
    assert page.links and all(target in page.ids for target in page.links)
    assert any(target.startswith("L") for target in page.links)


def test_page_has_summary_definitions_rules_and_mathml(site):
    page = parse(site / "eigh.html")
    text = " ".join(page.text)
    for section in ("summary", "definitions", "rules", "steps", "source"):
        assert section in page.ids
    assert "PASSED" in text and "numeric instances per step" in text and "tolerance" in text
    assert "pairwise-E" in page.ids and "pairwise-F" in page.ids
    assert "JVP" in text and "VJP" in text and "gauge residual" in text
    assert page.maths > 40  # every equation, definition and rule is MathML
    # a definition step reads as a definition, an identity as an identity
    assert "premise: a definition" in text and "premise: an identity of eigh" in text
    assert "verified exactly: rational arithmetic" in text
    assert "not applicable" not in text


def test_index_lists_the_operations(site):
    page = parse(site / "index.html")
    assert "eigh.html" in " ".join(open(site / "index.html").read().split())
    assert "passed" in " ".join(page.text)


def step_labels(html_text):
    return re.findall(r'<tr id="step-\d+"[^>]*>\s*<td class="num">\d+</td>\s*<td>([^<]*)', html_text)


def test_reads_as_the_equations_do(site):
    """Tangents are set apart from their neighbours (``A dU``, not ``AdU``), a complex derivation's
    labels say ``^H`` as its equations do, equation rows have no scrollbars, and the steps a helper
    module recorded link to the helper's source, which is on the page."""
    text = (site / "eigh.html").read_text()
    page = parse(site / "eigh.html")
    assert '<mi mathvariant="normal">d</mi><mi>U</mi>' in text and "<mi>dU</mi>" not in text
    assert '<mspace width="0.2em"/>' in text
    labels = step_labels(text)
    assert len(labels) > 30 and not [label for label in labels if "^T" in label or ".T*" in label or "**" in label]
    assert any("ᴴ" in label for label in labels)  # the conjugate transpose, as the equations write it
    assert not re.search(r"div\.eq \{[^}]*overflow(-x|-y)?\s*:", text)
    helper_lines = [i for i in page.ids if re.fullmatch(r"H\d+-L\d+", i)]
    assert len(helper_lines) > 20 and "Helper: " in " ".join(page.text)
    assert any(re.fullmatch(r"H\d+-L\d+", target) for target in page.links)


def test_matrix_function_page_prints_derivatives_and_the_second_order_rule(root, tmp_path):
    r = subprocess.run([sys.executable, "-m", "adjointgen", "--root", str(root), "audit", "funm", "--numeric-only",
                        "--html", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (tmp_path / "funm.html").read_text()
    maths = " ".join(re.findall(r"<math.*?</math>", text, flags=re.S))
    assert "f′" in maths and "Derivative" not in maths
    second = re.search(r'second-order rule</td>.*?</tr>\s*<tr class="equation[^"]*"><td></td><td colspan="5"><div class="eq">(.*?)</div>',
                       text, flags=re.S)
    assert second and "<math" in second.group(1)
