"""flashwatt's pages as a reader sees them: headless Chromium from the distribution's packages
(Debian's chromium and chromium-driver; .ci/chromium.sh installs them), driven by Selenium
pointed at that browser and its driver, never at one Selenium would download.

Each check returns the problems it found (an empty list for a page that reads well): script
errors in the console, a figure the browser could not show, a caption missing or broken
(a docutils error, template text left in it), a table without header or rows.
"""
from __future__ import annotations

import base64
import contextlib
import io
import shutil
import time
from pathlib import Path

CHROMIUM = "chromium"
CHROMEDRIVER = "chromedriver"
BROKEN_TEXT = ("System Message", "{{", "}}", "{%", "Undefined", "Traceback")


def browser_binaries() -> tuple[str | None, str | None]:
    """The distribution's browser and driver, where installed."""
    return (shutil.which(CHROMIUM) or shutil.which("chromium-browser"),
            shutil.which(CHROMEDRIVER) or next((p for p in ("/usr/lib/chromium/chromedriver",) if Path(p).exists()), None))


@contextlib.contextmanager
def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    """Script errors and failed loads the page logged (warnings are not errors)."""
    return [f"console error: {entry['message']}" for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def broken_text(where: str, text: str) -> list[str]:
    found = [marker for marker in BROKEN_TEXT if marker in text]
    return [f"{where}: broken text ({', '.join(found)}): {text[:200]!r}"] if found else []


def _image_problem(driver, image, what: str) -> str | None:
    shown = driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", image)
    src = image.get_attribute("src") or ""
    return None if shown else f"{what}: figure not shown ({src if len(src) < 200 else src[:80] + '...'})"


def _table_problems(table, what: str) -> list[str]:
    from selenium.webdriver.common.by import By

    headers = [th.text.strip() for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    problems = []
    if not headers or not all(headers[1:]):
        problems.append(f"{what}: a table without its header ({headers})")
    if not rows or not any(td.text.strip() for td in rows[0].find_elements(By.TAG_NAME, "td")):
        problems.append(f"{what}: a table without rows")
    if not table.is_displayed():
        problems.append(f"{what}: a table not displayed")
    return problems


def check_comparison_page(driver, page: Path) -> list[str]:
    """The comparison's page: its figures shown with captions, its tables readable, no errors."""
    from selenium.webdriver.common.by import By

    driver.get(page.resolve().as_uri())
    problems = []
    figures = driver.find_elements(By.TAG_NAME, "figure")
    if not figures:
        problems.append(f"{page}: no figure")
    for figure in figures:
        image = figure.find_element(By.TAG_NAME, "img")
        problem = _image_problem(driver, image, f"{page} {image.get_attribute('alt')!r}")
        problems += [problem] if problem else []
        captions = figure.find_elements(By.TAG_NAME, "figcaption")
        caption = captions[0].text.strip() if captions else ""
        if len(caption) < 20:
            problems.append(f"{page}: figure {image.get_attribute('alt')!r} has no caption")
        problems += broken_text(f"{page} caption", caption)
    for table in driver.find_elements(By.TAG_NAME, "table"):
        problems += _table_problems(table, f"{page} table {table.get_attribute('id')!r}")
    problems += broken_text(str(page), driver.find_element(By.TAG_NAME, "body").text)
    return problems + console_errors(driver)


def _wait(driver, css: str, seconds: float = 10.0):
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"nothing matched {css!r} after {seconds:.0f} s")


def _open_category(driver, name: str) -> list:
    """Open a category of the report's results (Figures, Tables); its rows."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, "#app nav ol li a").click()  # the breadcrumb home
    driver.find_element(By.XPATH, f"//nav//*[normalize-space(text())='{name}']").click()
    return _wait(driver, "#app nav table tbody tr")


def _shown_file_problems(driver, name: str, file_stem: str) -> list[str]:
    """What the report shows for one result: an image drawn, a PDF that is a PDF."""
    shown = f"#app nav + div img[src*='filename={file_stem}.'], #app nav + div iframe[src*='filename={file_stem}.']"
    try:
        element = _wait(driver, shown)[0]
    except AssertionError:
        return [f"report: result {name} shows nothing"]
    if element.tag_name == "img":
        problem = _image_problem(driver, element, f"report result {name}")
        return [problem] if problem else []
    src = element.get_attribute("src") or ""
    data = base64.b64decode(src.partition("base64,")[2] or "")
    return [] if data.startswith(b"%PDF") else [f"report: result {name} is not a PDF ({src[:60]})"]


def _csv_problems(link, name: str) -> list[str]:
    import pandas as pd

    href = link.get_attribute("href") or ""
    try:
        table = pd.read_csv(io.BytesIO(base64.b64decode(href.partition("base64,")[2])))
    except Exception as err:  # noqa: BLE001 - any unreadable table is the problem reported
        return [f"report: table {name} does not read as CSV: {err}"]
    return [] if len(table.columns) > 1 else [f"report: table {name} has no columns"]


def _result_problems(driver, category: str, index: int) -> list[str]:
    from selenium.webdriver.common.by import By

    row = _open_category(driver, category)[index]
    labels = [td.text for td in row.find_elements(By.TAG_NAME, "td") if td.text]
    name = " ".join(labels)
    eye = row.find_element(By.CSS_SELECTOR, "a[iconname=eye]")
    href = eye.get_attribute("href") or ""
    problems = _csv_problems(eye, name) if href.startswith("data:text/csv") else []
    if not href.startswith("data:text/csv"):
        eye.click()
        problems += _shown_file_problems(driver, name, labels[-1])
    row.find_element(By.CSS_SELECTOR, "a[iconname=information-circle]").click()
    items = [li.text.strip() for li in _wait(driver, "#app nav ul li")]
    caption = items[items.index("DESCRIPTION") + 1] if "DESCRIPTION" in items else ""
    if not caption:
        problems.append(f"report: result {name} has no caption")
    return problems + broken_text(f"report caption of {name}", caption)


def check_suite_report(driver, report: Path) -> list[str]:
    """The suite's report (Snakemake's self-contained HTML): its text, every figure shown and
    every table readable, each with its caption, and no script error while doing so."""
    from selenium.webdriver.common.by import By

    driver.get(report.resolve().as_uri())
    _wait(driver, "#app nav")
    problems = broken_text("report front page", driver.find_element(By.ID, "app").text)
    counts = {}
    for category in ("Figures", "Tables"):
        counts[category] = len(_open_category(driver, category))
        for index in range(counts[category]):
            problems += _result_problems(driver, category, index)
    if not counts["Figures"]:
        problems.append("report: no figure")
    return problems + console_errors(driver)
