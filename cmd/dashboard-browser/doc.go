// Package browsertest holds the dashboard's tests in a real browser:
// headless Chromium driven over the DevTools protocol (chromedp), against
// dashboard.Handler served on loopback. They live in the cmd module so that
// the library's go.mod does not carry chromedp.
//
// Chromium is found on PATH (chromium, chromium-browser, google-chrome).
// Without it the tests skip with a message, or fail when CI=true. With
// -screenshots DIR they also write a PNG of every page to DIR.
package browsertest
