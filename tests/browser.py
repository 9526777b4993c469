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


# text whose colour against the background behind it falls under WCAG's 3:1 (its minimum for large text and
# for the parts of a chart): each visible text's colour (an SVG text's fill) and the first background behind it
# that is mostly opaque, as the browser computes them
UNREADABLE = """() => {
    const rgb = (css) => {
        const m = css && css.match(/rgba?\\(([^)]+)\\)/);
        if (!m) return null;
        const [r, g, b, a = 1] = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
        return {r, g, b, a};
    };
    const luminance = ({r, g, b}) => {
        const f = (v) => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const behind = (el) => {
        for (let e = el; e; e = e.parentElement) {
            const c = rgb(getComputedStyle(e).backgroundColor);
            if (c && c.a > 0.5) return c;
        }
        return rgb(getComputedStyle(document.documentElement).backgroundColor) || {r: 255, g: 255, b: 255};
    };
    const found = [], seen = new Set();
    const walker = document.createTreeWalker(document.querySelector('#content') || document.body,
                                             NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
        const el = walker.currentNode.parentElement;
        if (!walker.currentNode.textContent.trim() || !el || seen.has(el)) continue;
        seen.add(el);
        const box = el.getBoundingClientRect(), style = getComputedStyle(el);
        if (!box.width || !box.height || style.visibility === 'hidden') continue;
        const fg = rgb(el instanceof SVGElement ? style.fill : style.color);
        if (!fg || fg.a === 0) continue;
        const a = luminance(fg), b = luminance(behind(el));
        const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        if (ratio < 3) found.push(`${el.tagName.toLowerCase()}.${[...el.classList].join('.')} `
                                  + `"${walker.currentNode.textContent.trim().slice(0, 30)}": ${ratio.toFixed(2)}`);
    }
    return found;
}"""


def assert_readable(page, *, dark: bool = False, screenshot=None) -> None:
    """Every text of the page stands out from what is behind it (3:1), in the admin's dark theme with `dark`
    (the page as the browser shows it then saved to `screenshot`, when given)."""
    page.emulate_media(color_scheme="dark" if dark else "light")
    try:
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
        unreadable = page.evaluate(UNREADABLE)
    finally:
        page.emulate_media(color_scheme="light")
    assert unreadable == [], f"{page.url} ({'dark' if dark else 'light'}) has text hard to read: {unreadable}"
