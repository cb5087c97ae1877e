// The dashboard's only script: refresh the overview's live part every few
// seconds, and ask before destructive forms. Pages work without it.
(function () {
  "use strict";

  function refresh(box) {
    var every = (Number(box.getAttribute("data-every")) || 5) * 1000;
    var src = box.getAttribute("data-src");
    var busy = false;
    window.setInterval(function () {
      // A hidden tab need not load the database; a slow answer must not pile up.
      if (document.hidden || busy) {
        return;
      }
      busy = true;
      fetch(src, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          return response.text();
        })
        .then(function (html) {
          // The fragment is rendered (and escaped) by the server, like the page.
          box.innerHTML = html;
          box.removeAttribute("data-stale");
        })
        .catch(function () {
          box.setAttribute("data-stale", "true");
        })
        .finally(function () {
          busy = false;
        });
    }, every);
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("live");
    if (box) {
      refresh(box);
    }
  });
})();
