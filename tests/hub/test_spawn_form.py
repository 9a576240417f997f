"""The GPU size form as a real JupyterHub renders it on its spawn page: a select its own
stylesheet (Bootstrap 5, JupyterHub 5 and 6) styles as a select, not as a text box."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.parse
import urllib.request
from html.parser import HTMLParser

import pytest
from hub_process import Hub

pytestmark = pytest.mark.timeout(300)

CLASSROOM = """
gpus: {count: 1, memory: 16GiB}
groups:
  students: [alice]
sizes:
  - {name: small, memory: 2GiB, cores: 20, policy: burst, default: true}
  - {name: large, memory: 6GiB, cores: 40, policy: burst}
"""


class Page(HTMLParser):
    """The classes of the size select and the page's stylesheets."""

    def __init__(self):
        super().__init__()
        self.select_classes: list[str] | None = None
        self.stylesheets: list[str] = []

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if tag == "select" and found.get("id") == "vgpu-profile":
            self.select_classes = (found.get("class") or "").split()
        if tag == "link" and found.get("rel") == "stylesheet":
            self.stylesheets.append(found["href"])


class Browser:
    """A user's browser session on the hub: logged in through its login form (the dummy
    authenticator takes any password), cookies kept, as a person reaches the spawn page."""

    def __init__(self, hub_url: str, name: str):
        self.hub_url = hub_url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        login = self.get("hub/login")
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', login)
        form = {"username": name, "password": "any", **({"_xsrf": xsrf.group(1)} if xsrf else {})}
        with self.opener.open(f"{hub_url}hub/login", data=urllib.parse.urlencode(form).encode(), timeout=60):
            pass

    def get(self, path: str) -> str:
        with self.opener.open(f"{self.hub_url}{path.lstrip('/')}", timeout=60) as reply:
            return reply.read().decode()


def css_rules(stylesheet: str, selector: str) -> list[str]:
    """The declarations of every rule whose selector list names exactly ``selector``."""
    return [
        body
        for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", stylesheet)
        if selector in (part.strip() for part in selectors.split(","))
    ]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    running = Hub(tmp_path_factory.mktemp("hub"), CLASSROOM)
    yield running
    running.stop()


def test_the_spawn_page_s_size_select_is_styled_as_a_select_by_the_hub_s_stylesheet(hub):
    alice = Browser(hub.url, "alice")
    page = Page()
    page.feed(alice.get("hub/spawn"))

    assert page.select_classes is not None, "the spawn page has no GPU size select"
    # Bootstrap 5 draws a select's arrow for form-select; form-control (Bootstrap 3's class for
    # every field) draws none, so the select looked like a text box.
    assert "form-select" in page.select_classes and "form-control" not in page.select_classes
    (stylesheet,) = [href for href in page.stylesheets if "style.min.css" in href]
    css = alice.get(stylesheet)
    assert any("background-image" in rule for rule in css_rules(css, ".form-select")), (
        "the hub's stylesheet draws no arrow for .form-select"
    )
