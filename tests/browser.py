"""What the admin browser tests ask of every page they open."""

WIDTH, HEIGHT = 1440, 900  # a common laptop screen; the browser_page fixture opens pages at this size

# boxes meant to scroll sideways inside the page: a drawn graph or chart, a code block
SCROLLERS = "pre, textarea, .wf-graph, .ev-chart, .evo-chart"

SIDEWAYS = """(scrollers) => [...document.querySelectorAll('body *')].filter(el => {
    const overflow = getComputedStyle(el).overflowX;
    return (overflow === 'auto' || overflow === 'scroll') && el.scrollWidth > el.clientWidth + 1
        && !el.matches(scrollers) && !el.closest(scrollers);
}).map(el => `${el.tagName.toLowerCase()}#${el.id}.${[...el.classList].join('.')}: `
             + `${el.scrollWidth} > ${el.clientWidth}`)"""


def assert_fits_the_screen(page) -> None:
    """The page scrolls down, never sideways, at WIDTH: neither the page nor a box in it (a list's table)."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= WIDTH, f"{page.url} is {width} px wide at a {WIDTH} px screen"
    sideways = page.evaluate(SIDEWAYS, SCROLLERS)
    assert sideways == [], f"{page.url} has boxes that scroll sideways: {sideways}"


OPERATOR, PASSWORD = "operator", "s3cret-pass"  # the user each browser test's scene creates


def log_in(page, live_server, then: str = "#user-tools") -> None:
    """Sign in to the admin as the scene's operator and wait for `then` on the page it lands on."""
    from django.urls import reverse

    page.goto(live_server.url + reverse("admin:login"))
    page.fill("#id_username", OPERATOR)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector(then)
