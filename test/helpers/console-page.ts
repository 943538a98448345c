/** Steps through the web console (docs/console.md) shared by the tests that drive it in Chromium. */
import type { Page } from 'playwright-core';

export const CONSOLE_VIEWS = [
  'overview',
  'topology',
  'peers',
  'services',
  'credentials',
  'events',
  'explain',
] as const;
export type ConsoleView = (typeof CONSOLE_VIEWS)[number];

/** Opens the console at `origin` and signs in with a client id and secret, through the page. */
export async function signIn(
  page: Page,
  origin: string,
  clientId: string,
  clientSecret: string,
): Promise<void> {
  await page.goto(`${origin}/ui/`);
  await page.getByLabel('Client id').fill(clientId);
  await page.getByLabel('Client secret').fill(clientSecret);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
}

/** Opens a view by its link in the navigation and waits for its heading. */
export async function show(page: Page, view: ConsoleView): Promise<void> {
  await page
    .getByRole('navigation', { name: 'views' })
    .getByRole('link', { name: new RegExp(`^${view}$`, 'i') })
    .click();
  await page.locator('main h1').first().waitFor();
}
