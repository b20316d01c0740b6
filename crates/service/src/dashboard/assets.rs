//! The stylesheet and the script every page loads inline.

pub(super) const CSS: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#f6f7f9}
header{background:#1f2937;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#e5e7eb;text-decoration:none;font-weight:600}header a:hover{color:#fff}
header .brand{font-size:16px;margin-right:12px}header .spacer{flex:1}
header form{margin:0}header input{font:inherit;padding:2px 6px;width:16em}
.warn{background:#fffbeb;border:1px solid #f59e0b;padding:8px 12px;margin:8px 0}
button,.button{font:inherit;padding:4px 10px;border:1px solid #9ca3af;border-radius:4px;background:#fff;cursor:pointer;color:#111;text-decoration:none}
button.danger{border-color:#b91c1c;color:#b91c1c}button.primary{border-color:#1d4ed8;color:#1d4ed8}
main{padding:16px;max-width:1200px}
table{border-collapse:collapse;background:#fff;margin:8px 0 16px}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.zero{color:#9ca3af}.state-dead,.state-open{color:#b91c1c;font-weight:600}
.state-succeeded,.state-closed{color:#047857}.state-running,.state-half_open{color:#b45309}
.state-deferred{color:#7c3aed}.muted{color:#6b7280}
pre{background:#fff;border:1px solid #e5e7eb;padding:8px;overflow:auto;max-height:300px}
.problem{background:#fff;border:1px solid #fca5a5;padding:12px}
ol.timeline{list-style:none;padding:0;border-left:3px solid #d1d5db;margin-left:8px}
ol.timeline li{position:relative;padding:4px 0 10px 16px}
ol.timeline li::before{content:"";position:absolute;left:-8px;top:8px;width:12px;height:12px;border-radius:50%;background:var(--c,#6b7280)}
.group{background:#fff;border:1px solid #e5e7eb;padding:8px 12px;margin:8px 0}
.cards{display:flex;gap:16px;flex-wrap:wrap}.card{background:#fff;border:1px solid #e5e7eb;padding:8px 12px}
"#;

pub(super) const JS: &str = r#"
(function(){
  var key='redrive-live-paused';
  var btn=document.getElementById('live-toggle');
  function paused(){return localStorage.getItem(key)==='1';}
  function show(){if(btn){btn.textContent=paused()?'Resume live refresh':'Pause live refresh';}}
  if(btn){btn.addEventListener('click',function(){localStorage.setItem(key,paused()?'0':'1');show();});}
  show();
  setInterval(function(){
    if(paused()||document.hidden)return;
    var live=document.getElementById('live');
    if(!live||live.dataset.live!=='1')return;
    if(live.querySelector('input:checked')||live.contains(document.activeElement)&&document.activeElement.tagName!=='BODY')return;
    fetch(location.href,{credentials:'same-origin'}).then(function(r){
      if(!r.ok)return null;return r.text();
    }).then(function(t){
      if(!t)return;
      var doc=new DOMParser().parseFromString(t,'text/html');
      var next=doc.getElementById('live');
      if(next){live.innerHTML=next.innerHTML;}
    }).catch(function(){});
  },2000);
})();
"#;
