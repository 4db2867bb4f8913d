"""The harness itself: the browser opens a built page from a file and measures it."""


def test_a_page_opens_from_a_file_at_the_asked_width(site, page_at):
    page = page_at((site / "book" / "intro.html").as_uri(), width=1280)
    assert page.title(), "the introduction has no title"
    assert page.evaluate("document.documentElement.clientWidth") == 1280
    assert page.evaluate("document.querySelector('main, article, .bd-article') !== null")
