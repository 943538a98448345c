/** Small shared pieces of the console: markup, actions guarded by scope, errors, pages, polls. */
import htm from 'htm';
import { type ComponentChildren, h } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import type { ScopeName } from '../../src/domain/scopes.js';
import { ApiFailure, can, get } from './api.js';

export const html = htm.bind(h);

/** A button for an action that needs a write scope: disabled, naming the scope, without it. */
export function Action(props: {
  need: ScopeName;
  onClick: () => void;
  children: ComponentChildren;
  kind?: string;
  testid?: string;
}) {
  const allowed = can(props.need);
  return html`<button
      type="button"
      class=${props.kind ?? ''}
      disabled=${!allowed}
      title=${allowed ? undefined : `needs the ${props.need} scope`}
      data-testid=${props.testid}
      onClick=${props.onClick}
    >${props.children}</button>${allowed ? null : html`<span class="need">needs ${props.need}</span>`}`;
}

/** A submit button under the same rule. */
export function Submit(props: { need: ScopeName; children: ComponentChildren; busy?: boolean }) {
  const allowed = can(props.need);
  return html`<button type="submit" class="primary" disabled=${!allowed || props.busy}>${props.children}</button
    >${allowed ? null : html`<span class="need">needs ${props.need}</span>`}`;
}

export function errorText(e: unknown): string {
  if (e instanceof ApiFailure) return `${e.code}: ${e.message}`;
  return e instanceof Error ? e.message : String(e);
}

export function ErrorBox(props: { error: unknown }) {
  if (!props.error) return null;
  return html`<p class="error" role="alert">${errorText(props.error)}</p>`;
}

/**
 * Which field of a form an API error concerns: the one the message names (the agent names the
 * field, e.g. "route: dest_cidr "x" is not CIDR notation"), else the one its code is about.
 */
export function fieldOf(
  e: unknown,
  fields: readonly string[],
  byCode: Record<string, string> = {},
): string | undefined {
  if (!(e instanceof ApiFailure)) return undefined;
  const named = fields.filter((f) => new RegExp(`\\b${f}\\b`).test(e.message));
  if (named.length > 0) return named[0];
  return byCode[e.code];
}

/** A labelled input with the API's error beside it when it concerns this field. */
export function Field(props: {
  label: string;
  name: string;
  error?: unknown;
  errorField?: string | undefined;
  children: ComponentChildren;
  hint?: string;
}) {
  const id = `f-${props.name}`;
  const mine = props.errorField === props.name;
  return html`<div class=${`field${mine ? ' invalid' : ''}`}>
    <label for=${id}>${props.label}</label>
    ${props.children}
    ${props.hint ? html`<small>${props.hint}</small>` : null}
    ${mine ? html`<span class="field-error" role="alert" id=${`${id}-error`}>${errorText(props.error)}</span>` : null}
  </div>`;
}

export const PAGE_SIZE = 20;

/** Pages of a long list: the slice to show and the controls to move. */
export function usePages<T>(items: T[]): { shown: T[]; pager: unknown } {
  const [page, setPage] = useState(0);
  const pages = Math.max(1, Math.ceil(items.length / PAGE_SIZE));
  const at = Math.min(page, pages - 1);
  const shown = items.slice(at * PAGE_SIZE, (at + 1) * PAGE_SIZE);
  const pager =
    pages <= 1
      ? null
      : html`<nav class="pager" aria-label="pages">
          <button type="button" disabled=${at === 0} onClick=${() => setPage(at - 1)}>Previous</button>
          <span>page ${at + 1} of ${pages} (${items.length})</span>
          <button type="button" disabled=${at >= pages - 1} onClick=${() => setPage(at + 1)}>Next</button>
        </nav>`;
  return { shown, pager };
}

/** A two-step confirmation: the action runs only after the user has read what it does. */
export function Confirm(props: {
  need: ScopeName;
  label: string;
  explain: string;
  onConfirm: () => Promise<void> | void;
  testid?: string;
}) {
  const [open, setOpen] = useState(false);
  if (!open) {
    return html`<${Action} need=${props.need} kind="danger" testid=${props.testid} onClick=${() => setOpen(true)}
      >${props.label}<//
    >`;
  }
  return html`<span class="confirm" role="group" aria-label=${`confirm ${props.label}`}>
    <span>${props.explain}</span>
    <button type="button" class="danger" onClick=${async () => {
      setOpen(false);
      await props.onConfirm();
    }}>Yes, ${props.label.toLowerCase()}</button>
    <button type="button" onClick=${() => setOpen(false)}>Cancel</button>
  </span>`;
}

/** A table that scrolls sideways on a narrow screen, reachable by keyboard. */
export function Table(props: { label: string; children: ComponentChildren }) {
  return html`<div class="table-wrap" tabindex="0" role="region" aria-label=${props.label}>
    <table>${props.children}</table>
  </div>`;
}

export const shortId = (id: string) => (id.length > 14 ? `${id.slice(0, 12)}…` : id);

/** Reads `path` now and every `everyMs`, while the view is shown. */
export function usePoll<T>(
  path: string | undefined,
  everyMs: number,
  read: (path: string) => Promise<T> = get<T>,
): { data: T | undefined; error: unknown } {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  useEffect(() => {
    if (!path) return;
    let live = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const tick = async () => {
      try {
        const r = await read(path);
        if (live) {
          setData(r);
          setError(undefined);
        }
      } catch (e) {
        if (live) setError(e);
      }
      if (live) timer = setTimeout(tick, everyMs);
    };
    tick();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [path, everyMs]);
  return { data, error };
}
