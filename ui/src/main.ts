/** The console's shell: sign-in, the navigation and the view of the location's hash. */
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import {
  endSession,
  restoreSession,
  SCOPE_PREFIX,
  type Session,
  signIn,
  signInWithCode,
  takeReturn,
} from './api.js';
import { ErrorBox, html } from './ui.js';
import { CredentialsView, PeersView, ServicesView } from './views-config.js';
import { EventsView, ExplainView, OverviewView, TopologyView } from './views-live.js';

const VIEWS = {
  overview: { title: 'Overview', view: OverviewView },
  topology: { title: 'Topology', view: TopologyView },
  peers: { title: 'Peers', view: PeersView },
  services: { title: 'Services', view: ServicesView },
  credentials: { title: 'Credentials', view: CredentialsView },
  events: { title: 'Events', view: EventsView },
  explain: { title: 'Explain', view: ExplainView },
} as const;
type ViewName = keyof typeof VIEWS;

const viewOf = (hash: string): ViewName => {
  const name = hash.replace(/^#\/?/, '');
  return name in VIEWS ? (name as ViewName) : 'overview';
};

function Login(props: { onSignedIn: (s: Session) => void; expired: boolean; codeError: unknown }) {
  const [error, setError] = useState<unknown>(props.codeError);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    const form = e.target as HTMLFormElement;
    const data = new FormData(form);
    setBusy(true);
    setError(undefined);
    try {
      const s = await signIn(String(data.get('client_id') ?? ''), String(data.get('client_secret') ?? ''));
      // The secret leaves the page with the form: nothing keeps it.
      form.reset();
      props.onSignedIn(s);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`<main class="login" id="main">
    <form class="card" onSubmit=${submit} aria-labelledby="login-h" autocomplete="off">
      <h1 id="login-h">mesh-agent console</h1>
      ${props.expired ? html`<p class="warn" role="status">Your session ended. Sign in again to go on where you were.</p>` : null}
      <div class="field"><label for="client_id">Client id</label><input id="client_id" name="client_id" required autocomplete="username" /></div>
      <div class="field"><label for="client_secret">Client secret</label>
        <input id="client_secret" name="client_secret" type="password" required autocomplete="current-password" /></div>
      <${ErrorBox} error=${error} />
      <button type="submit" class="primary" disabled=${busy}>${busy ? 'Signing in…' : 'Sign in'}</button>
      <p><small>The secret is sent once to this agent's token endpoint and never stored; the token stays in this tab until you sign out.</small></p>
    </form>
  </main>`;
}

function App() {
  const [s, setS] = useState<Session | undefined>(() => restoreSession(() => onEnded()));
  const [expired, setExpired] = useState(false);
  const [view, setView] = useState<ViewName>(viewOf(location.hash));
  const [codeError, setCodeError] = useState<unknown>(undefined);
  const [redeeming, setRedeeming] = useState(() => /^#code=/.test(location.hash));
  useEffect(() => {
    const code = /^#code=([A-Za-z0-9_-]+)$/.exec(location.hash)?.[1];
    if (!code) return;
    // Off the address bar and the history at once: the code is spent by this one use.
    history.replaceState(null, '', '#/overview');
    signInWithCode(code)
      .then(setS)
      .catch((err) => setCodeError(err))
      .finally(() => setRedeeming(false));
  }, []);
  function onEnded() {
    setExpired(sessionStorage.getItem('mesh-console.return') !== null);
    setS(undefined);
  }
  useEffect(() => {
    const changed = () => setView(viewOf(location.hash));
    addEventListener('hashchange', changed);
    return () => removeEventListener('hashchange', changed);
  }, []);
  useEffect(() => {
    document.title = s ? `${VIEWS[view].title} · mesh-agent console` : 'Sign in · mesh-agent console';
  }, [s, view]);
  if (!s && redeeming)
    return html`<main id="main"><p role="status">Signing in with the one-time code…</p></main>`;
  if (!s) {
    return html`<${Login}
      expired=${expired}
      codeError=${codeError}
      onSignedIn=${(n: Session) => {
        const back = takeReturn();
        if (back) location.hash = back;
        setExpired(false);
        setS(n);
      }}
    />`;
  }
  const View = VIEWS[view].view;
  const readOnly = !s.scopes.some((x) => x.endsWith('.write') || x === `${SCOPE_PREFIX}admin`);
  return html`<a class="skip" href="#main" onClick=${(e: Event) => {
    e.preventDefault();
    document.getElementById('main')?.focus();
  }}>Skip to content</a>
    <header>
      <span class="brand">mesh-agent</span>
      <nav aria-label="views">
        ${Object.entries(VIEWS).map(
          ([name, v]) =>
            html`<a href=${`#/${name}`} aria-current=${name === view ? 'page' : undefined}>${v.title}</a>`,
        )}
      </nav>
      <span class="who">${s.clientId}${readOnly ? html` <span class="tag">read-only</span>` : null}</span>
      <button type="button" onClick=${() => endSession(false)}>Sign out</button>
    </header>
    <main id="main" tabindex="-1"><${View} key=${view} /></main>`;
}

const root = document.getElementById('app');
if (root) {
  root.textContent = '';
  render(html`<${App} />`, root);
}
