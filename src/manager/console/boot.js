// Loads the console's modules (console.js and all it imports), and loads the page again when
// they could not be fetched. A module graph that fails to load stays failed for the page's
// life, and one file cut off is enough: Chromium fails requests in flight with
// ERR_NETWORK_CHANGED whenever a network interface comes or goes (on a host running kernels,
// each container's veth does), and the console's first load fetches a score of files at once.
// At most 3 reloads in a row (counted in this tab's sessionStorage), 0.5 s, 1 s, 1.5 s apart.
(() => {
  const KEY = 'kernelvisor.boot-reloads';
  const script = document.createElement('script');
  script.type = 'module';
  script.src = 'console.js';
  script.addEventListener('load', () => sessionStorage.removeItem(KEY));
  script.addEventListener('error', () => {
    const done = Number(sessionStorage.getItem(KEY) || 0);
    if (done >= 3) {
      sessionStorage.removeItem(KEY);
      document.getElementById('main').textContent = 'The console could not load its scripts: reload the page to try again.';
      return;
    }
    sessionStorage.setItem(KEY, String(done + 1));
    setTimeout(() => location.reload(), 500 * (done + 1));
  });
  document.head.append(script);
})();
