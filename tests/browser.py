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
